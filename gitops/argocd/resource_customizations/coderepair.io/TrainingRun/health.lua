-- Argo CD health of a coderepair.io TrainingRun, read from the conditions the operator writes.
-- A run is a batch workload (like a Job): Progressing while it starts and trains, Healthy once
-- training succeeded, Degraded when the trainer failed or the spec cannot be applied, and
-- Suspended while spec.suspend is set or Kueue holds the run (its Workload, status.queue) or
-- its trainer Job in the queue; Degraded when the run is larger than its queue can ever admit.
local hs = { status = "Progressing", message = "Waiting for the operator to report status" }

local function condition(conditions, type)
  for _, c in ipairs(conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local function is_true(c)
  return c ~= nil and c.status == "True"
end

local function said(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= nil and obj.status.observedGeneration < generation then
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end

local conditions = obj.status.conditions
local ready = condition(conditions, "Ready")
local failed = condition(conditions, "Failed")
local succeeded = condition(conditions, "Succeeded")
local suspended = condition(conditions, "Suspended")
local admitted = condition(conditions, "Admitted")

if is_true(failed) then
  hs.status = "Degraded"
  hs.message = "Training failed: " .. said(failed, "the trainer Job failed")
elseif is_true(succeeded) then
  hs.status = "Healthy"
  hs.message = "Training succeeded: " .. said(succeeded, "the trainer Job completed")
elseif ready ~= nil and ready.status == "False" and (ready.reason == "InvalidSpec" or ready.reason == "ApplyFailed" or ready.reason == "PruneFailed") then
  hs.status = "Degraded"
  hs.message = ready.reason .. ": " .. said(ready, "see the TrainingRun's conditions")
elseif is_true(suspended) then
  hs.status = "Suspended"
  hs.message = "Suspended: " .. said(suspended, "spec.suspend is true")
elseif admitted ~= nil and admitted.status == "False" and admitted.reason == "ExceedsQuota" then
  hs.status = "Degraded"
  hs.message = "ExceedsQuota: " .. said(admitted, "larger than its queue's quota")
elseif obj.status.queue ~= nil and obj.status.queue.state ~= nil and obj.status.queue.state ~= "Admitted" and obj.status.queue.state ~= "Unqueued" then
  hs.status = "Suspended"
  hs.message = obj.status.queue.state .. ": " .. said(admitted, "waiting for Kueue to admit the run")
elseif admitted ~= nil and admitted.status == "False" and admitted.reason == "JobSuspended" then
  hs.status = "Suspended"
  hs.message = "Queued: " .. said(admitted, "the trainer Job is not admitted yet")
elseif is_true(ready) then
  hs.message = "Training: " .. said(condition(conditions, "Training"), said(ready, "inference, sandboxes and trainer are up"))
elseif ready ~= nil then
  hs.message = ready.reason .. ": " .. said(ready, "not ready yet")
end
return hs
