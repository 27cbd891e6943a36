"""The Redis store's Lua scripts, registered with redis-py's ``register_script``.

Scripts touch only the keys they are given, and report a key of the wrong type by
name (``{"foreign", key, what}``) instead of failing with ``WRONGTYPE``.
"""

from __future__ import annotations

from typing import Any

from redis.commands.core import Script

from ..terms import foreign

# Every script reports a key of the wrong type as {'foreign', key, what it holds}.
# redis.pcall returns an error as a table instead of aborting the script.

# KEYS: lock, epoch, watch. ARGV: nonce, instance id, ttl ms, lowest acceptable
# epoch - 1, our presence id ("" for none), presence channel prefix, "1" when
# presence may be checked, release channel. Returns {1, value, ttl ms, 0, TIME}
# when taken, {0, holder value, pttl, watching, TIME} when held (watching = 1: the
# caller is the designated successor). TIME ({s, us}, read after every write) is
# the server's clock. A holder whose presence nobody keeps is taken over here.
ACQUIRE = """
local function present(id)
  return redis.call('PUBSUB', 'NUMSUB', ARGV[6] .. id)[2] > 0
end
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then return {'foreign', KEYS[1], redis.call('TYPE', KEYS[1]).ok} end
local check = ARGV[7] == '1'
local taken_over = false
if cur then
  local ok, term = pcall(cjson.decode, cur)
  local id = ok and type(term) == 'table' and term.presence
  if not check or type(id) ~= 'string' or present(id) then
    -- One follower watches closely (the caller, unless a present one does already).
    local watching = 0
    if check and ARGV[5] ~= '' then
      local w = redis.pcall('GET', KEYS[3])
      if type(w) ~= 'string' or w == ARGV[5] or not present(w) then
        redis.call('SET', KEYS[3], ARGV[5], 'PX', ARGV[3])
        watching = 1
      end
    end
    local now = redis.call('TIME')
    return {0, cur, redis.call('PTTL', KEYS[1]), watching, now[1], now[2]}
  end
  taken_over = true
end
local kind = redis.call('TYPE', KEYS[2]).ok
if kind == 'none' then
  -- First term, or the store lost its data: start from the server's clock in ms
  -- so that epochs still grow past any term handed out before.
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], t[1] * 1000 + math.floor(t[2] / 1000))
elseif kind ~= 'string' then
  return {'foreign', KEYS[2], kind}
end
local epoch = redis.pcall('INCR', KEYS[2])
if type(epoch) == 'table' then return {'foreign', KEYS[2], redis.call('GET', KEYS[2])} end
local floor = tonumber(ARGV[4])
if epoch <= floor then
  epoch = floor + 1
  redis.call('SET', KEYS[2], epoch)
end
local presence = nil
if ARGV[5] ~= '' then presence = ARGV[5] end
-- The term's start on the server's clock, for "leader status" (seconds, 4 decimals
-- survive cjson's 14 significant digits).
local started = redis.call('TIME')
local since = tonumber(started[1]) + tonumber(started[2]) / 1000000
local value = cjson.encode({
  token = ARGV[1], epoch = epoch, holder = ARGV[2], presence = presence, since = since
})
redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
if presence and redis.pcall('GET', KEYS[3]) == presence then redis.call('DEL', KEYS[3]) end
if taken_over then redis.call('PUBLISH', ARGV[8], 'taken over') end
local now = redis.call('TIME')
return {1, value, tonumber(ARGV[3]), 0, now[1], now[2]}
"""

# KEYS: lock, resign. ARGV: our exact value, ttl ms. Returns {code, TIME}: code
# 0 lost, 1 renewed, 2 resign; TIME as in ACQUIRE (read after the writes).
# A lock or resign key of another type cannot hold our value: lost, no resign.
RENEW = """
local code = 1
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  code = 0
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if redis.pcall('GET', KEYS[2]) == ARGV[1] then
    redis.call('DEL', KEYS[2])
    code = 2
  end
end
local now = redis.call('TIME')
return {code, now[1], now[2]}
"""

# KEYS: lock. ARGV: our exact value, release channel.
RELEASE = """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
"""

# KEYS: lock (only so that Cluster runs it on the election's node). ARGV: channel.
# How many subscribers the channel has on that node.
SUBSCRIBERS = """
return redis.call('PUBSUB', 'NUMSUB', ARGV[1])[2]
"""

# KEYS: lock. Returns {value or nil, pttl}.
TERM = """
local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' then return {'foreign', KEYS[1], redis.call('TYPE', KEYS[1]).ok} end
return {cur, redis.call('PTTL', KEYS[1])}
"""

# KEYS: state. Returns {1, field, value, ...}, or {0, type} when it is no hash.
LOAD_STATE = """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'hash' and kind ~= 'none' then return {0, kind} end
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, 1)
return out
"""

# KEYS: lock, state. ARGV: our exact value, then per claim: entry, has-expected
# ("0"/"1"), expected, new. Returns one 0/1 per claim; {} when the term is gone.
# A state of another type is not ours to keep: the fenced claim replaces it.
CLAIM = """
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return {} end
local kind = redis.call('TYPE', KEYS[2]).ok
if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', KEYS[2]) end
local out = {}
for i = 2, #ARGV, 4 do
  local cur = redis.call('HGET', KEYS[2], ARGV[i])
  local ok
  if ARGV[i + 1] == '0' then ok = (cur == false) else ok = (cur == ARGV[i + 2]) end
  if ok then
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 3])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""

# KEYS: lock, state. ARGV: our exact value, then per claim: entry, the value the
# claim wrote, has-previous ("0"/"1"), previous. Puts back what a claim
# replaced, where the claim's value is still there; returns how many.
UNCLAIM = """
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('TYPE', KEYS[2]).ok ~= 'hash' then return 0 end
local n = 0
for i = 2, #ARGV, 4 do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[i + 1] then
    if ARGV[i + 2] == '1' then
      redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 3])
    else
      redis.call('HDEL', KEYS[2], ARGV[i])
    end
    n = n + 1
  end
end
return n
"""

# The start of the marks' script. KEYS: runs (hash, key -> record), run expiries
# (sorted set, key -> expiry ms). Refuses keys of another type, sets ``now`` (ms).
_RUNS_PROLOGUE = """
for i = 1, 2 do
  local kind = redis.call('TYPE', KEYS[i]).ok
  local want = 'hash'
  if i == 2 then want = 'zset' end
  if kind ~= want and kind ~= 'none' then return {'foreign', KEYS[i], kind} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: runs, run expiries. ARGV: key, has-expected ("0"/"1"), expected, new, ttl
# ms. Returns {1, new} when written, {0, stored record or false} when not. Up to
# 100 expired records are dropped first: the ledger expires without a sweeper.
PUT_RUN = _RUNS_PROLOGUE + """
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)
for _, key in ipairs(old) do
  redis.call('HDEL', KEYS[1], key)
  redis.call('ZREM', KEYS[2], key)
end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local ok
if ARGV[2] == '0' then ok = (cur == false) else ok = (cur == ARGV[3]) end
if not ok then return {0, cur} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[5]), ARGV[1])
return {1, ARGV[4]}
"""

# The start of the per-entry run-record scripts. KEYS: the entry's records (hash,
# suffix -> "<tally>|<expiry ms, base 36>|<record>"), their creation order (list,
# oldest first: a tenth of a sorted set's memory), its summary (hash: "last" -> the
# greatest suffix kept, "n:<tally>" -> count). Refuses keys of another type, sets
# ``now`` and defines parse(stored) -> tally, expiry, record.
_ENTRY_RUNS_PROLOGUE = """
for _, at in ipairs({{1, 'hash'}, {2, 'list'}, {3, 'hash'}}) do
  local kind = redis.call('TYPE', KEYS[at[1]]).ok
  if kind ~= at[2] and kind ~= 'none' then return {'foreign', KEYS[at[1]], kind} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function parse(stored)
  local tally, expiry, record = string.match(stored, '^([^|]*)|([^|]*)|(.*)$')
  return tally, tonumber(expiry, 36) or 0, record
end
"""

# KEYS: as in _ENTRY_RUNS_PROLOGUE, then the entries with records (sorted set, ->
# newest expiry), the marks' hash and expiries. ARGV: entry, key, suffix,
# has-expected, expected, new, ttl ms, keep (0: no cap), tally, most dropped.
# Returns as PUT_RUN does. Each write drops, oldest created first, up to ARGV[10]
# expired records (stopping at the first live one) and as many over the cap. A
# previous release's record among the marks is compared with, and moved here.
PUT_ENTRY_RUN = _ENTRY_RUNS_PROLOGUE + """
local function b36(n)
  local out = ''
  repeat
    local d = n % 36
    out = string.sub('0123456789abcdefghijklmnopqrstuvwxyz', d + 1, d + 1) .. out
    n = math.floor(n / 36)
  until n == 0
  return out
end
local function drop(suffix)
  local v = redis.call('HGET', KEYS[1], suffix)
  if v then
    local tally = parse(v)
    if tally and tally ~= '' then redis.call('HINCRBY', KEYS[3], 'n:' .. tally, -1) end
    redis.call('HDEL', KEYS[1], suffix)
  end
end
local most = tonumber(ARGV[10])
local marks = redis.call('TYPE', KEYS[5]).ok == 'hash' and redis.call('TYPE', KEYS[6]).ok == 'zset'
if marks then
  -- The previous release's slots among the marks drain a few per write.
  for _, key in ipairs(redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, 10)) do
    redis.call('HDEL', KEYS[5], key)
    redis.call('ZREM', KEYS[6], key)
  end
end
local stored = redis.call('HGET', KEYS[1], ARGV[3])
local cur = false
if stored then
  local _, expiry, record = parse(stored)
  if expiry > now then cur = record end
end
local legacy = false
if not cur and marks then
  local at = redis.call('ZSCORE', KEYS[6], ARGV[2])
  if at and tonumber(at) > now then
    cur = redis.call('HGET', KEYS[5], ARGV[2])
    legacy = cur ~= false
  end
end
local ok
if ARGV[4] == '0' then ok = (cur == false) else ok = (cur == ARGV[5]) end
if not ok then return {0, cur} end
if legacy then
  redis.call('HDEL', KEYS[5], ARGV[2])
  redis.call('ZREM', KEYS[6], ARGV[2])
end
if stored then drop(ARGV[3]) else redis.call('RPUSH', KEYS[2], ARGV[3]) end
local ttl = tonumber(ARGV[7])
redis.call('HSET', KEYS[1], ARGV[3], ARGV[9] .. '|' .. b36(now + ttl) .. '|' .. ARGV[6])
if ARGV[9] ~= '' then redis.call('HINCRBY', KEYS[3], 'n:' .. ARGV[9], 1) end
local last = redis.call('HGET', KEYS[3], 'last')
if not last or ARGV[3] > last then redis.call('HSET', KEYS[3], 'last', ARGV[3]) end
for _ = 1, most do
  local head = redis.call('LINDEX', KEYS[2], 0)
  if not head then break end
  local v = redis.call('HGET', KEYS[1], head)
  if v then
    local _, expiry = parse(v)
    if expiry > now then break end
  end
  redis.call('LPOP', KEYS[2])
  drop(head)
end
local keep = tonumber(ARGV[8])
if keep > 0 then
  for _ = 1, math.min(redis.call('LLEN', KEYS[2]) - keep, most) do
    drop(redis.call('LPOP', KEYS[2]))
  end
end
-- The greatest suffix went while others stay: the newest created stands for it.
if redis.call('HEXISTS', KEYS[1], redis.call('HGET', KEYS[3], 'last')) == 0 then
  redis.call('HSET', KEYS[3], 'last', redis.call('LINDEX', KEYS[2], -1))
end
-- Every record of the entry expires by the newest write's expiry: so do its keys,
-- and an entry nobody writes any more goes with its last record.
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
redis.call('ZADD', KEYS[4], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
return {1, ARGV[6]}
"""

# KEYS: as in _ENTRY_RUNS_PROLOGUE. ARGV: first rank, last rank (counted from
# the newest created). Returns {suffix, record, ...} of those that have not expired.
RUNS_OF = _ENTRY_RUNS_PROLOGUE + """
local out = {}
local page = redis.call('LRANGE', KEYS[2], -1 - tonumber(ARGV[2]), -1 - tonumber(ARGV[1]))
for i = #page, 1, -1 do
  local v = redis.call('HGET', KEYS[1], page[i])
  if v then
    local _, expiry, record = parse(v)
    if expiry > now then
      out[#out + 1] = page[i]
      out[#out + 1] = record
    end
  end
end
return out
"""

# The start of both entry scripts. KEYS: entries (hash), entries version,
# entries changes (sorted set, name -> the version of its last edit).
_ENTRIES_PROLOGUE = """
for _, at in ipairs({{1, 'hash'}, {3, 'zset'}}) do
  local kind = redis.call('TYPE', KEYS[at[1]]).ok
  if kind ~= at[2] and kind ~= 'none' then return {'foreign', KEYS[at[1]], kind} end
end
"""

# KEYS: as in _ENTRIES_PROLOGUE. ARGV: changes kept, then per edit: name,
# has-expected, expected, has-new, new. Returns one 0/1 per edit; when any applied
# the version moves by one and each applied name is recorded at it. The member ''
# scores the newest version dropped (or one moved by an edit that recorded
# nothing), so a reader from before it reads everything. No term needed.
EDIT_ENTRIES = _ENTRIES_PROLOGUE + """
local out, applied = {}, {}
for i = 2, #ARGV, 5 do
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  local ok
  if ARGV[i + 1] == '1' then ok = current == ARGV[i + 2] else ok = current == false end
  if ok then
    if ARGV[i + 3] == '1' then
      redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 4])
    else
      redis.call('HDEL', KEYS[1], ARGV[i])
    end
    applied[#applied + 1] = ARGV[i]
  end
  table.insert(out, ok and 1 or 0)
end
if #applied > 0 then
  local before = tonumber(redis.call('GET', KEYS[2]) or '0')
  local newest = redis.call('ZREVRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if before > 0 and (newest[2] == nil or tonumber(newest[2]) ~= before) then
    redis.call('ZADD', KEYS[3], before, '')
  end
  local version = redis.call('INCR', KEYS[2])
  for _, name in ipairs(applied) do redis.call('ZADD', KEYS[3], version, name) end
  local excess = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[1])
  if excess > 0 then
    local dropped = redis.call('ZPOPMIN', KEYS[3], excess)
    redis.call('ZADD', KEYS[3], dropped[#dropped], '')
  end
end
return out
"""

# KEYS: as in _ENTRIES_PROLOGUE. ARGV: the reader's version. Returns {version, 1,
# name, value or false, ...} since then, or {version, 0}: read every entry.
ENTRIES_SINCE = _ENTRIES_PROLOGUE + """
local version = tonumber(redis.call('GET', KEYS[2]) or '0')
local since = tonumber(ARGV[1])
if version == since then return {version, 1} end
local newest = redis.call('ZREVRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if version < since or newest[2] == nil or tonumber(newest[2]) ~= version then
  return {version, 0}
end
local out = {version, 1}
for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf')) do
  if name == '' then return {version, 0} end
  out[#out + 1] = name
  out[#out + 1] = redis.call('HGET', KEYS[1], name)
end
return out
"""

# The start of both journal scripts. KEYS: per log, its records (hash, key ->
# record) then its keys (sorted set, every score 0: ordered by the key's bytes).
_JOURNAL_PROLOGUE = """
for i = 1, #KEYS do
  local want = 'hash'
  if i % 2 == 0 then want = 'zset' end
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= want and kind ~= 'none' then return {'foreign', KEYS[i], kind} end
end
"""

# KEYS: as in _JOURNAL_PROLOGUE. ARGV: per write, the number of its log in KEYS
# (1: the first pair), key, record, keep. Each write leaves its log its keep
# greatest keys, dropping all that fall out: one, unless keep was lowered.
# No term: any process writes the journal.
JOURNAL_WRITE = _JOURNAL_PROLOGUE + """
for i = 1, #ARGV, 4 do
  local at = 2 * tonumber(ARGV[i])
  local records, keys = KEYS[at - 1], KEYS[at]
  redis.call('HSET', records, ARGV[i + 1], ARGV[i + 2])
  redis.call('ZADD', keys, 0, ARGV[i + 1])
  local excess = redis.call('ZCARD', keys) - tonumber(ARGV[i + 3])
  if excess > 0 then
    for _, key in ipairs(redis.call('ZRANGE', keys, 0, excess - 1)) do
      redis.call('HDEL', records, key)
    end
    redis.call('ZREMRANGEBYRANK', keys, 0, excess - 1)
  end
end
return 1
"""

# KEYS: as in _JOURNAL_PROLOGUE, one log. ARGV: limit, the greatest key to read
# as ZREVRANGEBYLEX takes it ('+' for all, '(' .. key for those below it).
# Returns {1, key, record, ...}, greatest key first (the 1 first: a key may be
# any text, 'foreign' too).
JOURNAL_READ = _JOURNAL_PROLOGUE + """
local out = {1}
for _, key in ipairs(redis.call('ZREVRANGEBYLEX', KEYS[2], ARGV[2], '-', 'LIMIT', 0, ARGV[1])) do
  local record = redis.call('HGET', KEYS[1], key)
  if record then
    out[#out + 1] = key
    out[#out + 1] = record
  end
end
return out
"""

# KEYS: lock (only so that Cluster runs it on the election's node). The server's TIME.
TIME = """
return redis.call('TIME')
"""

#: Every script by name.
SOURCES = {
    "acquire": ACQUIRE,
    "renew": RENEW,
    "release": RELEASE,
    "term": TERM,
    "subscribers": SUBSCRIBERS,
    "load_state": LOAD_STATE,
    "claim": CLAIM,
    "unclaim": UNCLAIM,
    "time": TIME,
    "put_run": PUT_RUN,
    "put_entry_run": PUT_ENTRY_RUN,
    "runs_of": RUNS_OF,
    "edit_entries": EDIT_ENTRIES,
    "entries_since": ENTRIES_SINCE,
    "journal_write": JOURNAL_WRITE,
    "journal_read": JOURNAL_READ,
}

#: What each key is meant to hold, for errors about a key of the wrong type.
_EXPECTED = {
    "lock": "a celery-leader term (a JSON string)",
    "epoch": "an epoch counter (an integer string)",
    "runs": "the run ledger's marks (a hash)",
    "runs-expiry": "the run ledger marks' expiries (a sorted set)",
    "run-entries": "the run ledger's entries (a sorted set)",
    "entries": "schedule entries (a hash)",
    "entries-changes": "the schedule entries' recent edits (a sorted set)",
    "journal": "a journal log's records (a hash)",
    "journal-keys": "a journal log's keys (a sorted set)",
}


def register(client: Any) -> dict[str, Script]:
    """Every script, registered on ``client`` (nothing is sent to the server yet)."""
    return {name: client.register_script(source) for name, source in SOURCES.items()}


def checked(reply: Any) -> Any:
    """``reply``, or the error naming the key a script found of the wrong type."""
    if isinstance(reply, list) and reply and reply[0] == "foreign":
        raise wrong_type(reply[1], reply[2])
    return reply


def wrong_type(key: str, found: str) -> Exception:
    """The error for ``key`` holding a value of Redis type ``found``, not ours."""
    # After the hash tag: the key's name, and what a per-entry or per-log key's starts with.
    name = key.rsplit("}:", 1)[-1]
    expected = _EXPECTED.get(name) or _EXPECTED.get(name.split(":", 1)[0], "a celery-leader value")
    return foreign(f"Redis key {key!r}", found, expected)
