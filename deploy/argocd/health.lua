-- Argo CD health check of batchfill.io/BatchedModel: the value of the argocd-cm key
-- resource.customizations.health.batchfill.io_BatchedModel (deploy/argocd/kustomization.yaml puts it there).
-- It reads what the operator writes (docs/operations.md, "GitOps health"; operator/batchfill/controller/readiness.py):
--   * status.observedGeneration below metadata.generation: Progressing (the operator has not seen the spec yet);
--   * Stalled=True, or Ready=False for a reason waiting does not fix: Degraded;
--   * Progressing=True (a rollout, a new plan): Progressing;
--   * Ready=True: Healthy; Ready=False otherwise (no replica Ready yet): Progressing.
-- Lua 5.1, as Argo CD's interpreter (gopher-lua) runs it; tests/unit/test_argocd_health.py runs it on status
-- objects saved from the cluster tests.
local degraded = {
  InvalidSpec = true, InvalidBatching = true, SLAInfeasible = true, ApplyRejected = true,
  ReplicasFailing = true, SLAAtRisk = true,
}

local function health(status, message)
  return { status = status, message = message }
end

if obj.status == nil or obj.status.conditions == nil then
  return health("Progressing", "Waiting for the batchfill operator to write status")
end
local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= generation then
  return health("Progressing", "Waiting for the batchfill operator to observe generation " .. generation)
end

local found = {}
for _, condition in ipairs(obj.status.conditions) do
  -- a condition computed from an older spec says nothing about this one
  if condition.observedGeneration == nil or generation == nil or condition.observedGeneration == generation then
    found[condition.type] = condition
  end
end
local ready, progressing, stalled = found["Ready"], found["Progressing"], found["Stalled"]
if ready == nil then
  return health("Progressing", "Waiting for the Ready condition")
end
if stalled ~= nil and stalled.status == "True" then
  return health("Degraded", stalled.reason .. ": " .. (stalled.message or ""))
end
if ready.status == "False" and degraded[ready.reason] then
  return health("Degraded", ready.reason .. ": " .. (ready.message or ""))
end
if progressing ~= nil and progressing.status == "True" then
  return health("Progressing", progressing.reason .. ": " .. (progressing.message or ""))
end
if ready.status == "True" then
  return health("Healthy", ready.message or "")
end
return health("Progressing", ready.reason .. ": " .. (ready.message or ""))
