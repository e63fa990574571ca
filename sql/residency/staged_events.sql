-- Events in the current stage.
SELECT count() FROM kv_residency_stage_events
