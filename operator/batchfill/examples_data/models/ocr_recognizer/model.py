"""Triton Python-backend model: PaddleOCR's PP-OCRv4 text-line recognizer on CPU (onnxruntime).

The trained weights ship inside the ``rapidocr-onnxruntime`` wheel
(``rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx``) and are loaded from the installed package, never
downloaded; the package is located with ``importlib.util.find_spec`` so its ``__init__`` (OpenCV) is not run.

Tensors (per sample, Triton adds the batch axis): input ``x`` TYPE_FP32 [3, 48, 320] (a normalised text-line
crop); outputs ``tokens`` TYPE_INT64 [40] (the most likely character class per time step, CTC-style, 0 =
blank) and ``scores`` TYPE_FP32 [40] (its probability). Returning the arg-max instead of the 40 x 6625
probability matrix keeps responses small, as a serving deployment would.

All requests of one ``execute`` call run as ONE onnxruntime batch, so Triton's dynamic batcher really batches
the computation. ``intra_op_num_threads`` (model-config parameter, default 1) pins it to one core so the
measured profile is reproducible.
"""

import importlib.util
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

ONNX_FILE = "ch_PP-OCRv4_rec_infer.onnx"


def _package_model_path(filename):
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise pb_utils.TritonModelException(
            "rapidocr-onnxruntime is not installed (pip install --no-deps rapidocr-onnxruntime==1.4.4)"
        )
    path = os.path.join(next(iter(spec.submodule_search_locations)), "models", filename)
    if not os.path.isfile(path):
        raise pb_utils.TritonModelException(f"{path} not found in the installed rapidocr-onnxruntime package")
    return path


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(params.get("intra_op_num_threads") or 1)
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(_package_model_path(ONNX_FILE), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        self.output_name = self.session.get_outputs()[0].name

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        sizes = [a.shape[0] for a in arrays]
        batch = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        probs = self.session.run([self.output_name], {self.input_name: batch.astype(np.float32, copy=False)})[0]
        tokens = probs.argmax(axis=2).astype(np.int64)
        scores = probs.max(axis=2).astype(np.float32)
        cuts = np.cumsum(sizes)[:-1]
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("tokens", t), pb_utils.Tensor("scores", s)])
            for t, s in zip(np.split(tokens, cuts), np.split(scores, cuts), strict=True)
        ]

    def finalize(self):
        self.session = None
