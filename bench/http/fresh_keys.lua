-- wrk script: POST /orders (or WRK_PATH) with a fresh Idempotency-Key per request.
-- Keys are unique across threads and runs: run id (WRK_RUN) - thread - counter.
local run = os.getenv("WRK_RUN") or tostring(os.time())
local path = os.getenv("WRK_PATH") or "/orders"
local threads = {}
local counter = 0
-- A global, not a local: setup() sets it per thread (thread:set), and a local
-- of this chunk would hide that value (every thread sent the same keys).
thread_id = 0

function setup(thread)
  thread:set("thread_id", #threads + 1)
  table.insert(threads, thread)
end

function request()
  counter = counter + 1
  local headers = {
    ["Idempotency-Key"] = run .. "-" .. thread_id .. "-" .. counter,
    ["Authorization"] = "Bearer bench",
    ["Content-Type"] = "application/json",
  }
  return wrk.format("POST", path, headers, '{"item":"book","quantity":1}')
end

function response(status, headers, body)
  if status ~= 201 then
    io.stderr:write("unexpected status " .. status .. "\n")
  end
end
