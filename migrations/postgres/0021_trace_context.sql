-- phase: expand
-- Trace context (issue 22): the W3C traceparent and tracestate of the span
-- that wrote an outbox row, sent as the CloudEvents distributed-tracing
-- extension, and of the event that created a notification intent, sent to
-- the provider. Nullable and unread by older releases: they keep writing
-- rows without it, which are published without trace context.
ALTER TABLE outbox ADD COLUMN traceparent TEXT, ADD COLUMN tracestate TEXT;
ALTER TABLE notification_intents ADD COLUMN traceparent TEXT, ADD COLUMN tracestate TEXT;
INSERT INTO schema_phases (version, phase, readers_from) VALUES (21, 'expand', 16);
