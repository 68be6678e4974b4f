"""Triton Python-backend model: PaddleOCR's text-line orientation classifier on CPU (onnxruntime).

The trained weights ship inside the ``rapidocr-onnxruntime`` wheel
(``rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx``); they are loaded from the installed
package, never downloaded. The package is located with ``importlib.util.find_spec`` so its ``__init__``
(which needs OpenCV) is never imported.

Tensors (per sample, Triton adds the batch axis): input ``x`` TYPE_FP32 [3, 48, 192] (a normalised text-line
crop), output ``probs`` TYPE_FP32 [2] (softmax over {0°, 180°}).

All requests of one ``execute`` call run as ONE onnxruntime batch (inputs concatenated along axis 0, outputs
split back per request), so Triton's dynamic batcher really batches the computation.

Optional model-config ``parameters``: ``onnx_file`` (another model file of the package, default the classifier),
``intra_op_num_threads`` (default 1: one core per instance, so the measured profile is reproducible).
"""

import importlib.util
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

DEFAULT_ONNX = "ch_ppocr_mobile_v2.0_cls_infer.onnx"


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
        onnx_file = params.get("onnx_file") or DEFAULT_ONNX
        threads = int(params.get("intra_op_num_threads") or 1)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(_package_model_path(onnx_file), options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        self.output_name = self.session.get_outputs()[0].name

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        sizes = [a.shape[0] for a in arrays]
        batch = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)
        probs = self.session.run([self.output_name], {self.input_name: batch.astype(np.float32, copy=False)})[0]
        outs = np.split(probs.astype(np.float32, copy=False), np.cumsum(sizes)[:-1], axis=0)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("probs", o)]) for o in outs]

    def finalize(self):
        self.session = None
