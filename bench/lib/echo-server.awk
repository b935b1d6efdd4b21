# A cheap stdio MCP server (a few hundred KB of RSS) for the idle-session
# memory workload, where 500 Node children would measure the children.
# Answers initialize, tools/list, tools/call echo and ping; ignores notifications.
# Usage: mawk -W interactive -f bench/lib/echo-server.awk (mawk block-buffers pipes otherwise)
{
  if (!match($0, /"id":[ ]*("[^"]*"|-?[0-9]+)/)) next
  id = substr($0, RSTART, RLENGTH); sub(/"id":[ ]*/, "", id)
  if ($0 ~ /"method":[ ]*"initialize"/)
    r = "{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{\"tools\":{}},\"serverInfo\":{\"name\":\"bench-echo\",\"version\":\"1\"}}"
  else if ($0 ~ /"method":[ ]*"tools\/list"/)
    r = "{\"tools\":[{\"name\":\"echo\",\"inputSchema\":{\"type\":\"object\",\"properties\":{\"message\":{\"type\":\"string\"}}}}]}"
  else if ($0 ~ /"method":[ ]*"tools\/call"/) {
    msg = ""
    if (match($0, /"message":[ ]*"[^"]*"/)) { msg = substr($0, RSTART, RLENGTH); sub(/"message":[ ]*"/, "", msg); sub(/"$/, "", msg) }
    r = "{\"content\":[{\"type\":\"text\",\"text\":\"Echo: " msg "\"}]}"
  } else
    r = "{}"
  printf "{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":%s}\n", id, r
  fflush()
}
