-- Notification dispatch: claims (owner, token, lease) kept apart from the
-- intent's status, attempts and the next attempt time, and the evidence an
-- outcome rests on (the provider's receipt, or why it is unknown).

ALTER TABLE notification_intents ADD COLUMN claim_owner TEXT;
ALTER TABLE notification_intents ADD COLUMN claim_token TEXT;
ALTER TABLE notification_intents ADD COLUMN claimed_at_ms BIGINT;
ALTER TABLE notification_intents ADD COLUMN claim_expires_at_ms BIGINT;
ALTER TABLE notification_intents ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE notification_intents ADD COLUMN next_attempt_at_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE notification_intents ADD COLUMN first_attempt_at_ms BIGINT;
ALTER TABLE notification_intents ADD COLUMN receipt TEXT;
ALTER TABLE notification_intents ADD COLUMN last_error TEXT;
-- 1 when the latest claim replaced one that never finished: that attempt's
-- call may have reached the provider.
ALTER TABLE notification_intents ADD COLUMN reclaimed INTEGER NOT NULL DEFAULT 0;
-- Who decided a manual resolution (reconcile), for the audit trail.
ALTER TABLE notification_intents ADD COLUMN resolved_by TEXT;

CREATE INDEX notification_intents_due ON notification_intents (status, next_attempt_at_ms);
