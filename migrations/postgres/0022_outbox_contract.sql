-- phase: expand
-- The public outbox contract (issue 23): any application appends events in
-- its own transaction with herald.append_event(...), which computes what the
-- relay needs (slice, sequence) so no caller reimplements it.
--
-- content_type: the data's media type (application/avro, application/json);
-- existing rows are Avro. extensions: CloudEvents extension attributes as a
-- JSON object of strings, sent as ce_<name> headers. An empty topic means
-- "route by the relay's configuration" (--route, --default-topic).
-- Older relays (schema 16-21) publish every row as Avro to its topic: let
-- them all finish upgrading before applications use the contract.
ALTER TABLE outbox ADD COLUMN content_type TEXT NOT NULL DEFAULT 'application/avro', ADD COLUMN extensions TEXT;

CREATE SCHEMA IF NOT EXISTS herald;

-- The slice of a partition key: 64-bit FNV-1a of its UTF-8 bytes, modulo
-- 16 (herald_store::outbox::slice_of; the test vectors in
-- docs/outbox-contract.md pin both). numeric, because bigint arithmetic
-- refuses to wrap.
CREATE FUNCTION herald.slice_of(partition_key TEXT) RETURNS INTEGER
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    bytes BYTEA := convert_to(partition_key, 'UTF8');
    hash NUMERIC := 14695981039346656037;
    low INTEGER;
BEGIN
    FOR i IN 0 .. length(bytes) - 1 LOOP
        low := (hash % 256)::INTEGER;
        hash := hash - low + (low # get_byte(bytes, i));
        hash := (hash * 1099511628211) % 18446744073709551616;
    END LOOP;
    RETURN (hash % 16)::INTEGER;
END
$$;

-- Appends one event in the caller's transaction and returns its sequence.
-- Herald's own export domain appends through it too (no private path).
-- Refuses (SQLSTATE 22023, or 23505 for a duplicate) anything the relay
-- could not publish as a CloudEvent, so nothing half-valid is committed.
CREATE FUNCTION herald.append_event(
    source TEXT,
    id TEXT,
    type TEXT,
    subject TEXT,
    partition_key TEXT,
    data BYTEA,
    content_type TEXT DEFAULT 'application/json',
    dataschema TEXT DEFAULT NULL,
    extensions JSONB DEFAULT NULL,
    topic TEXT DEFAULT '',
    "time" TIMESTAMPTZ DEFAULT NULL,
    traceparent TEXT DEFAULT NULL,
    tracestate TEXT DEFAULT NULL
) RETURNS BIGINT
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    name TEXT;
    value JSONB;
    written BIGINT;
    at_ms BIGINT := (extract(epoch FROM COALESCE("time", clock_timestamp())) * 1000)::BIGINT;
BEGIN
    IF COALESCE(source, '') = '' OR COALESCE(id, '') = '' OR COALESCE(type, '') = '' THEN
        RAISE EXCEPTION 'herald.append_event: source, id and type are required (CloudEvents)' USING ERRCODE = '22023';
    END IF;
    IF partition_key IS NULL OR data IS NULL THEN
        RAISE EXCEPTION 'herald.append_event: partition_key and data are required' USING ERRCODE = '22023';
    END IF;
    IF content_type = 'application/avro' AND COALESCE(dataschema, '') = '' THEN
        RAISE EXCEPTION 'herald.append_event: Avro data needs a dataschema consumers can resolve' USING ERRCODE = '22023';
    ELSIF content_type = 'application/json' THEN
        BEGIN
            PERFORM convert_from(data, 'UTF8')::JSONB;
        EXCEPTION WHEN OTHERS THEN
            RAISE EXCEPTION 'herald.append_event: data is not JSON (content_type application/json)' USING ERRCODE = '22023';
        END;
    ELSIF content_type IS DISTINCT FROM 'application/avro' THEN
        RAISE EXCEPTION 'herald.append_event: content_type must be application/json or application/avro, not %', content_type
            USING ERRCODE = '22023';
    END IF;
    IF extensions IS NOT NULL THEN
        IF jsonb_typeof(extensions) <> 'object' THEN
            RAISE EXCEPTION 'herald.append_event: extensions must be a JSON object of strings' USING ERRCODE = '22023';
        END IF;
        FOR name, value IN SELECT * FROM jsonb_each(extensions) LOOP
            IF name !~ '^[a-z0-9]{1,20}$' OR name IN ('id', 'source', 'specversion', 'type', 'datacontenttype',
                'dataschema', 'subject', 'time', 'data', 'traceparent', 'tracestate') THEN
                RAISE EXCEPTION 'herald.append_event: extension name % is not allowed (a-z0-9, at most 20, not a CloudEvents attribute)', name
                    USING ERRCODE = '22023';
            END IF;
            IF jsonb_typeof(value) <> 'string' THEN
                RAISE EXCEPTION 'herald.append_event: extension % must be a string', name USING ERRCODE = '22023';
            END IF;
        END LOOP;
    END IF;
    IF EXISTS (SELECT 1 FROM outbox o WHERE o.source = append_event.source AND o.event_id = append_event.id) THEN
        RAISE EXCEPTION 'herald.append_event: event (source %, id %) is already in the outbox', source, id USING ERRCODE = '23505';
    END IF;
    IF traceparent IS NOT NULL AND traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' THEN
        RAISE EXCEPTION 'herald.append_event: traceparent is not a W3C traceparent' USING ERRCODE = '22023';
    END IF;
    INSERT INTO outbox (event_id, source, event_type, subject, event_time_ms, schema_file, data, topic, partition_key,
                        status, created_at_ms, slice, content_type, extensions, traceparent, tracestate)
    VALUES (id, source, type, COALESCE(subject, ''), at_ms, COALESCE(dataschema, ''), data, COALESCE(topic, ''),
            partition_key, 'pending', (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
            herald.slice_of(partition_key), content_type, extensions::TEXT, traceparent, tracestate)
    RETURNING seq INTO written;
    RETURN written;
END
$$;

INSERT INTO schema_phases (version, phase, readers_from) VALUES (22, 'expand', 16);
