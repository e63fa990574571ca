-- Stage every interval the increment touches: its stores (open or closed inside it, prior = 0) and the committed open intervals it ends (prior = 1, end_ord = the ending event).
-- One pass: the staged events are grouped into chains (source, medium, hash, clear generation;
-- the group key is (block_hash, a 64-bit hash of the rest), as the window definition's
-- partition), each chain's events in ord order in one array; a chain is joined once to the
-- committed state (its open interval, its last removal) and to the clear that ends it, then
-- unrolled into its stores, plus one row for a committed open interval it ends. Each store's
-- neighbours are the array's previous and next elements (arrays shifted by one, unrolled
-- together), which is what lagInFrame / leadInFrame over the chain's window give, at a
-- fraction of the cost. Committed state is read only when there is any ({committed} > 0).
INSERT INTO kv_residency_stage_candidates
WITH
-- include: chain
SELECT * EXCEPT (p_event) FROM
(
    SELECT
        instance, dp_rank, if(k = 1, o_model, ev.6) AS model, if(k = 1, o_role, ev.7) AS role,
        epoch, medium, block_hash, if(k = 1, o_tokens, ev.5) AS tokens,
        if(k = 1, o_start_ts, ev.3) AS start_ts,
        multiIf(k = 1, if(chain_found = 1, first_ts, clear_ts), next_event != 0, next_ts, clear_found = 1,
                clear_ts, ev.3) AS end_ts,
        multiIf(k = 1, if(chain_found = 1, if(first_event = 2, 'removed', 'restored'), 'cleared'),
                next_event = 2, 'removed', next_event = 1, 'restored',
                clear_found = 1, 'cleared', 'open') AS end_kind,
        multiIf(k > 2, prev_event, o_found = 1 AND (v_found = 0 OR o_store_ord > v_removal_ord), 1,
                v_found = 1, 2, 0) AS p_event,
        multiIf(k = 1, o_refault, p_event = 2, 1, 0) AS refault,
        multiIf(k = 1, o_refault_distance, p_event != 2, 0,
                toUInt64(ev.4 - if(k > 2, prev_removals, v_removals_so_far))) AS refault_distance,
        if(k = 1, o_store_ord, ev.1) AS store_ord,
        multiIf(k = 1, o_removal_ord, p_event != 2, 0, k > 2, prev_ord, v_removal_ord) AS removal_ord,
        if(k = 1, 0, clear_gen) AS clear_gen,
        if(k = 1, if(chain_found = 1, first_ord, clear_ord), 0) AS end_ord,
        toUInt8(k = 1) AS prior
    FROM chains_joined
    ARRAY JOIN
        arrayEnumerate(ext) AS k, ext AS ev, ext_prev_event AS prev_event, ext_prev_ord AS prev_ord,
        ext_prev_removals AS prev_removals, ext_next_event AS next_event, ext_next_ts AS next_ts
    WHERE if(k = 1, o_found = 1 AND (chain_found = 1 OR clear_found = 1), ev.2 = 1)
)
