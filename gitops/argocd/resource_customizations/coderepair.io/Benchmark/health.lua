-- Argo CD health of a coderepair.io Benchmark, read from the conditions the operator writes.
-- A benchmark is a batch workload (like a Job): Progressing while it starts and runs, Healthy
-- once the runner succeeded, Degraded when it failed or the spec cannot be applied, and
-- Suspended while Kueue holds its runner Job in the queue.
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
local running = condition(conditions, "Running")
local progress = obj.status.progress

if is_true(failed) then
  hs.status = "Degraded"
  hs.message = "Benchmark failed: " .. said(failed, "the runner Job failed")
elseif is_true(succeeded) then
  hs.status = "Healthy"
  hs.message = "Benchmark finished"
  if obj.status.resolveRate ~= nil then
    hs.message = hs.message .. ": resolve rate " .. obj.status.resolveRate
  end
elseif ready ~= nil and ready.status == "False" and (ready.reason == "InvalidSpec" or ready.reason == "ApplyFailed" or ready.reason == "PruneFailed") then
  hs.status = "Degraded"
  hs.message = ready.reason .. ": " .. said(ready, "see the Benchmark's conditions")
elseif running ~= nil and running.status == "False" and running.reason == "JobSuspended" then
  hs.status = "Suspended"
  hs.message = "Queued: the runner Job is not admitted yet"
elseif is_true(running) then
  hs.message = "Running"
  if progress ~= nil and progress.total ~= nil then
    hs.message = "Running: " .. (progress.done or 0) .. "/" .. progress.total .. " instances done"
  end
elseif ready ~= nil then
  hs.message = ready.reason .. ": " .. said(ready, "not ready yet")
end
return hs
