-- wrk script: each request is a join (or, with MODE=status, a status poll) by the next
-- account from the identity-token file; each wrk thread walks its own slice, so every join
-- in a run is a new account.
local tokens = {}
local path_join = "/queue/" .. (os.getenv("EVENT") or "bench") .. "/join"
local path_status = "/queue/" .. (os.getenv("EVENT") or "bench") .. "/status"
local mode = os.getenv("MODE") or "join"
local threads = 0

function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end

function init(args)
  for line in io.lines(os.getenv("TOKENS")) do tokens[#tokens + 1] = line end
  local n = tonumber(os.getenv("WRK_THREADS") or "2")
  slice = math.floor(#tokens / n)
  i = (id or 0) * slice
end

function request()
  i = i + 1
  local t = tokens[(i % #tokens) + 1]
  if mode == "status" then
    return wrk.format("GET", path_status, { ["Authorization"] = "Bearer " .. t })
  end
  return wrk.format("POST", path_join, { ["Authorization"] = "Bearer " .. t, ["Content-Length"] = "0" })
end
