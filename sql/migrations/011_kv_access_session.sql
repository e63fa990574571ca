-- kvscope migration 011: kv_accesses gains `session`, the request's session or cache salt.
--
-- BlockAccess carries it since the vLLM plugin publishes the access stream (vLLM's
-- `session_id`, else `cache_salt`); "" when a request has neither, and in rows stored
-- before this migration. Read by the `session_hit_rate` query.
ALTER TABLE kv_accesses ADD COLUMN IF NOT EXISTS session String DEFAULT '' AFTER held_until_free
