-- phase: expand
-- Wake only the slice that has new rows (issue 20, latency): the outbox's
-- insert trigger notified every relay slice of every commit, so with 16
-- slices each commit cost 16 reads of which 15 found nothing — at a few
-- hundred commits a second, most of a small machine. Now the notification
-- carries the slice (one per slice a statement wrote; identical ones in a
-- transaction fold into one). Releases of schema 18 and earlier treat any
-- notification as "look at every slice", so they keep working beside it.
CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    written INTEGER;
BEGIN
    FOR written IN SELECT DISTINCT slice FROM new_rows LOOP
        PERFORM pg_notify('herald_outbox', written::text);
    END LOOP;
    RETURN NULL;
END
$$;
DROP TRIGGER outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();

INSERT INTO schema_phases (version, phase, readers_from) VALUES (19, 'expand', 18);
