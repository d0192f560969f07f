-- Notification calls under a claim: when the holder began its provider call
-- (NULL when no call of the current claim has started, or it finished), so a
-- claim that expired before its call began is taken over as a clean one; and
-- whether any earlier attempt may have reached the provider without an
-- answer, so nothing later resends it past what the provider can collapse.

ALTER TABLE notification_intents ADD COLUMN call_started_at_ms BIGINT;
ALTER TABLE notification_intents ADD COLUMN may_have_executed INTEGER NOT NULL DEFAULT 0;

-- Rows from before: a claim held now may have a call in flight, and an
-- `unknown` intent's last attempt may have executed.
UPDATE notification_intents SET call_started_at_ms = claimed_at_ms WHERE claim_token IS NOT NULL;
UPDATE notification_intents SET may_have_executed = 1 WHERE status = 'unknown';
