-- wrk's request for the serving benchmark (bench/serving.py): POST the file BODY_FILE with
-- the Content-Type CONTENT_TYPE, the same bytes on every request.
local file = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = os.getenv("CONTENT_TYPE")

-- wrk --latency prints 50/75/90/99 only: the 99.9th too, where bench/serving.py reads it.
function done(summary, latency, requests)
  io.write(string.format("p99.9 latency: %dus\n", latency:percentile(99.9)))
end
