-- Argo CD health of a coderepair.io RolloutPool, read from the conditions the operator writes.
-- A pool is a service: Healthy once its gateway serves leases (how many sandboxes are warm is
-- in the message; filling a large pool can take long), Progressing while the gateway starts,
-- Degraded when the spec cannot be applied.
local hs = { status = "Progressing", message = "Waiting for the operator to report status" }

local function condition(conditions, type)
  for _, c in ipairs(conditions) do
    if c.type == type then
      return c
    end
  end
  return nil
end

if obj.status == nil or obj.status.conditions == nil then
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= nil and obj.status.observedGeneration < generation then
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end

local ready = condition(obj.status.conditions, "Ready")
if ready == nil then
  return hs
end
local message = ready.message
if message == nil or message == "" then
  message = ready.reason
end
if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = message
elseif ready.reason == "InvalidSpec" or ready.reason == "ApplyFailed" or ready.reason == "PruneFailed" then
  hs.status = "Degraded"
  hs.message = ready.reason .. ": " .. message
else
  hs.message = ready.reason .. ": " .. message
end
return hs
