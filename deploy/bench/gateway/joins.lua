-- wrk script: each request is a join (or, with MODE=status, a status poll) by the next
-- account from the identity-token file; each wrk thread walks its own slice, so every join
-- in a run is a new account.
--   RECEIPTS=file (join mode): append each answer's place receipt to file.<thread>.
--   MODE=status with lines "token receipt": polls show the receipt (x-floodgate-place), so
--   the gateway answers from memory.
local tokens = {}
local receipts = {}
local path_join = "/queue/" .. (os.getenv("EVENT") or "bench") .. "/join"
local path_status = "/queue/" .. (os.getenv("EVENT") or "bench") .. "/status"
local mode = os.getenv("MODE") or "join"
local threads = 0

function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end

function init(args)
  for line in io.lines(os.getenv("TOKENS")) do
    local t, r = line:match("^(%S+)%s+(%S+)$")
    if t then
      tokens[#tokens + 1] = t
      receipts[#tokens] = r
    else
      tokens[#tokens + 1] = line
    end
  end
  local n = tonumber(os.getenv("WRK_THREADS") or "2")
  slice = math.floor(#tokens / n)
  i = (id or 0) * slice
  if os.getenv("RECEIPTS") then
    out = io.open(os.getenv("RECEIPTS") .. "." .. (id or 0), "a")
  end
end

function request()
  i = i + 1
  local k = (i % #tokens) + 1
  local t = tokens[k]
  if mode == "status" then
    local h = { ["Authorization"] = "Bearer " .. t }
    if receipts[k] then h["X-Floodgate-Place"] = receipts[k] end
    return wrk.format("GET", path_status, h)
  end
  return wrk.format("POST", path_join, { ["Authorization"] = "Bearer " .. t, ["Content-Length"] = "0" })
end

if os.getenv("RECEIPTS") then
  function response(status, headers, body)
    local r = body:match('"receipt":"([^"]+)"')
    if r then out:write(r, "\n") end
  end
end
