-- phase: expand
-- The relay records progress as its cursor alone (issue 20): a row the
-- cursor of its slice passed is delivered, and no longer gets `delivered`
-- and `delivered_at_ms` written (herald-store's `delivered` derives it).
-- What an offline rebuild's verification asks — "was this row delivered
-- before the boundary was read?" — then needs the cursors as they stood:
-- the rebuild keeps them with the generation (JSON, herald-store's
-- `delivered::SliceCursor`). Releases of schema 17 read nothing this adds,
-- and the rows they mark `delivered` still read as delivered.
ALTER TABLE projection_generations ADD COLUMN settled_cursors TEXT;

INSERT INTO schema_phases (version, phase, readers_from) VALUES (18, 'expand', 17);
