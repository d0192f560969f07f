-- phase: expand
-- An expand migration leaves the bar where it was: every release that ran
-- before it still runs after it. Rows 18 and 19 recorded their
-- predecessor's version as `readers_from`. This release reads only contract
-- rows, but v0.10.0 reads the highest `readers_from` of any row, so after
-- `herald migrate` to 19 it refused to start (exit 2) and rolling back the
-- last step of an upgrade from it failed. Expand rows now carry the bar of
-- 0017 (no contraction since), and so does this one.
UPDATE schema_phases SET readers_from = 16 WHERE phase = 'expand' AND readers_from > 16;
INSERT INTO schema_phases (version, phase, readers_from) VALUES (20, 'expand', 16);
