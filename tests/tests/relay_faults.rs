//! Invariant 5 and 7 under faults, on the mock cluster: the broker down, the
//! broker refusing produce requests, an acknowledgement lost before the
//! progress write, a relay paused past its lease, a record the broker can
//! never take. Races are forced with gates and injected faults, not sleeps.

mod relay_support;

use herald_kafka::KafkaConfig;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use herald_fault::{Action, Hook, Point};
use herald_relay::RelayConfig;
use herald_relay::claims::{self as store, slice_of};
use herald_store::{Db, outbox};
use herald_testkit::Gate;
use herald_testkit::kafka::first_occurrences_by_key;
use rdkafka::types::RDKafkaRespErr;
use relay_support::{assert_commit_order, bench, config, stat, wait_until, with_faults};

#[tokio::test(flavor = "multi_thread")]
async fn broker_down_rows_stay_pending_and_go_out_when_it_returns() -> anyhow::Result<()> {
    let b = bench(true).await?;
    b.kafka.broker_down(1)?;
    let keys: Vec<String> = (0..20).map(|i| format!("down-{}", i % 5)).collect();
    let ids = b.append(&keys.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    let relay = b.start(config("down"))?;
    // Every row is in the producer's hands, and none is acknowledged.
    wait_until("all rows sent", || async { Ok(stat(&relay.stats.sent) >= 20) }).await?;
    assert_eq!(b.count(&b.delivered()).await?, 0, "nothing is delivered while the broker is down");
    assert_eq!(b.count("SELECT COUNT(*) AS n FROM outbox WHERE status = 'pending'").await?, 20);

    b.kafka.broker_up(1)?;
    b.wait_count(&b.delivered(), 20).await?;
    relay.stop().await?;
    assert_commit_order(&keys, &ids, &b.records()?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_produce_requests_are_retried_with_the_same_event_id() -> anyhow::Result<()> {
    let b = bench(true).await?;
    let refused = RDKafkaRespErr::RD_KAFKA_RESP_ERR_POLICY_VIOLATION;
    b.kafka.produce_errors(&[refused, refused])?;
    let ids = b.append(&["refused"; 3]).await?;
    let relay = b.start(config("refused"))?;
    b.wait_count(&b.delivered(), 3).await?;
    let stats = relay.stats.clone();
    relay.stop().await?;

    let (status, attempts) = b.status_of(&ids[0]).await?;
    assert_eq!(status, outbox::DELIVERED);
    assert!(attempts >= 2, "the first row was refused before it went out: {attempts} attempts");
    assert!(stat(&stats.retried) >= 1);
    let records = b.records()?;
    // What reached Kafka carries the ids stored with the rows, in order.
    assert_eq!(first_occurrences_by_key(&records)["refused"], ids);
    assert!(records.iter().all(|r| ids.contains(&r.ce_id)));
    Ok(())
}

/// A broker answers a produce request with DUPLICATE_SEQUENCE_NUMBER when the
/// batch's sequence lies before the first batch it has cached for the
/// producer. After a leader change that happens to records that were never
/// written: the new leader took the producer's later batch as its first
/// (KIP-360 lets a producer it does not know start at any sequence), and the
/// retried earlier batch then looks like a duplicate. librdkafka reports such
/// a message delivered, without an offset. The drill lost an event this way
/// (a 3-node cluster, a leader killed while a relay's first batch to the
/// partition waited for it). Only a delivery with an offset proves a write.
#[tokio::test(flavor = "multi_thread")]
async fn a_success_without_an_offset_is_not_taken_for_a_write() -> anyhow::Result<()> {
    let b = bench(true).await?;
    b.kafka.produce_errors(&[RDKafkaRespErr::RD_KAFKA_RESP_ERR_DUPLICATE_SEQUENCE_NUMBER])?;
    let ids = b.append(&["dup-seq"]).await?;
    let relay = b.start(config("dup-seq"))?;
    b.wait_count(&b.delivered(), 1).await?;
    relay.stop().await?;

    let records = b.records()?;
    assert_eq!(first_occurrences_by_key(&records).get("dup-seq"), Some(&ids), "the delivered row's record is in Kafka: {records:?}");
    let (_, attempts) = b.status_of(&ids[0]).await?;
    assert!(attempts >= 1, "the unconfirmed send counts as a failed attempt: {attempts}");
    Ok(())
}

/// Loses the acknowledgement of the first batch, as if the relay died between
/// the broker's ack and the progress write.
fn lose_first_ack() -> Hook {
    let lost = Arc::new(AtomicBool::new(false));
    Hook::new(move |site| {
        let first = site.point == Point::BeforeProgress && !lost.swap(true, Ordering::SeqCst);
        async move { if first { Action::LoseAck } else { Action::Continue } }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_ack_republishes_the_rows_with_the_same_event_ids() -> anyhow::Result<()> {
    let b = bench(true).await?;
    let ids = b.append(&["lost-ack"; 10]).await?;
    let running = b.start(with_faults(config("lost-ack"), lose_first_ack()))?;
    b.wait_count(&b.delivered(), 10).await?;
    let stats = running.stats.clone();
    running.stop().await?;

    assert_eq!(stat(&stats.unrecorded), 1);
    let records = b.records()?;
    for id in &ids {
        let copies = records.iter().filter(|r| &r.ce_id == id).count();
        assert_eq!(copies, 2, "{id}: published, ack lost, published again with the same id");
    }
    assert_eq!(first_occurrences_by_key(&records)["lost-ack"], ids);
    Ok(())
}

/// The database refuses the first write that moves a cursor (a trigger; a
/// sequence counts across the rolled-back attempt).
async fn fail_first_cursor_write(db: &Db) -> anyhow::Result<()> {
    for statement in [
        "CREATE SEQUENCE progress_failures",
        "CREATE FUNCTION fail_first_progress() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         IF nextval('progress_failures') = 1 THEN RAISE EXCEPTION 'injected: the progress write fails'; END IF; \
         RETURN NEW; END $$",
        "CREATE TRIGGER fail_first_progress BEFORE UPDATE ON relay_slices FOR EACH ROW \
         WHEN (OLD.cursor_seq IS DISTINCT FROM NEW.cursor_seq OR OLD.cursor_xid IS DISTINCT FROM NEW.cursor_xid \
         OR OLD.cursor_lo IS DISTINCT FROM NEW.cursor_lo) EXECUTE FUNCTION fail_first_progress()",
    ] {
        sqlx::query(statement).execute(db.pool()).await?;
    }
    Ok(())
}

/// With one batch in flight the next batch is only read while a batch's
/// progress commits; when that write fails, the batch read meanwhile must not
/// go out: both go again from the recorded cursor. Publishing it before the
/// write's outcome is known would put a third batch of copies in the topic.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_progress_write_sends_the_batch_read_meanwhile_only_after_it_again() -> anyhow::Result<()> {
    let copies = after_a_failed_progress_write(1).await?;
    assert_eq!(copies[..5], [2; 5], "the unrecorded batch went out again");
    assert_eq!(copies[5..], [1; 5], "the batch read meanwhile went out once, after it");
    Ok(())
}

/// With two batches in flight the second is out before the first's progress
/// write fails: it goes out again after the first's second copy, so the first
/// copies stay in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_progress_write_sends_the_batches_behind_it_again_after_it() -> anyhow::Result<()> {
    let copies = after_a_failed_progress_write(2).await?;
    assert_eq!(copies, [2; 10], "the unrecorded batch and the one sent behind it went out again");
    Ok(())
}

/// Ten rows of one key in batches of five, `in_flight` batches at once; the
/// first progress write fails. Checks the first copies' order; returns each
/// row's number of copies.
async fn after_a_failed_progress_write(in_flight: usize) -> anyhow::Result<Vec<usize>> {
    let b = bench(true).await?;
    fail_first_cursor_write(&b.db).await?;
    let ids = b.append(&["progress-fails"; 10]).await?;
    let running = b.start(RelayConfig { batch_size: 5, in_flight, ..config("progress-fails") })?;
    b.wait_count(&b.delivered(), 10).await?;
    let stats = running.stats.clone();
    running.stop().await?;

    assert_eq!(stat(&stats.unrecorded), 1, "one progress write failed");
    let records = b.records()?;
    assert_eq!(first_occurrences_by_key(&records)["progress-fails"], ids);
    Ok(ids.iter().map(|id| records.iter().filter(|r| &r.ce_id == id).count()).collect())
}

/// A slice sends its next batch while the broker still has the previous one
/// to acknowledge: the relay is held before its first progress write until
/// the second batch is on the topic (with one batch in flight it never
/// would be), then each record is there once and in order.
#[tokio::test(flavor = "multi_thread")]
async fn the_next_batch_goes_out_before_the_last_one_is_recorded() -> anyhow::Result<()> {
    let b = bench(true).await?;
    let key = "pipelined";
    let ids = b.append(&[key; 10]).await?;
    let (reached, resume) = (Gate::new(2), Gate::new(2));
    let faults = pause_before_progress(slice_of(key), reached.clone(), resume.clone());
    let running = b.start(with_faults(RelayConfig { batch_size: 5, in_flight: 2, ..config("pipelined") }, faults))?;
    reached.arrive_and_wait().await; // the first batch is acknowledged, not recorded
    let second: Vec<String> = ids[5..].to_vec();
    wait_until("the second batch on the topic", || async {
        let records = b.records()?;
        Ok(second.iter().all(|id| records.iter().any(|r| &r.ce_id == id)))
    })
    .await?;
    assert_eq!(b.count(&b.delivered()).await?, 0, "nothing recorded yet");
    resume.arrive_and_wait().await;
    b.wait_count(&b.delivered(), 10).await?;
    running.stop().await?;

    let records = b.records()?;
    assert_eq!(records.len(), 10, "each record once: {records:?}");
    assert_eq!(first_occurrences_by_key(&records)[key], ids);
    Ok(())
}

/// Holds the relay right before its first progress write of `slice` until
/// the test lets it go: a relay paused (GC, SIGSTOP, slow disk) past its lease.
fn pause_before_progress(slice: i32, reached: Gate, resume: Gate) -> Hook {
    let paused = Arc::new(AtomicBool::new(false));
    Hook::new(move |site| {
        let pause = site.point == Point::BeforeProgress && site.subject == slice.to_string() && !paused.swap(true, Ordering::SeqCst);
        let (reached, resume) = (reached.clone(), resume.clone());
        async move {
            if pause {
                reached.arrive_and_wait().await;
                resume.arrive_and_wait().await;
            }
            Action::Continue
        }
    })
}

/// Rows committed while a slice waits for the broker's verdicts on its
/// batch go out without waiting for them when there is room for a second
/// batch: the NOTIFY wakes the wait. The broker is down, so the first batch's verdicts cannot
/// come; with one batch in flight the new rows would wait for them.
#[tokio::test(flavor = "multi_thread")]
async fn rows_committed_while_a_batch_awaits_its_acks_go_out_beside_it() -> anyhow::Result<()> {
    let b = bench(true).await?;
    let key = "woken";
    b.kafka.broker_down(1)?;
    let mut ids = b.append(&[key; 5]).await?;
    let relay = b.start(RelayConfig { in_flight: 2, ..config("woken") })?;
    wait_until("the first batch sent", || async { Ok(stat(&relay.stats.sent) == 5) }).await?;
    // Five commits: the first wakes the slice, which sends what it reads
    // as its second batch; the rest wait for room.
    ids.extend(b.append(&[key; 5]).await?);
    wait_until("rows committed since sent too", || async { Ok(stat(&relay.stats.sent) > 5) }).await?;
    assert_eq!(b.count(&b.delivered()).await?, 0, "nothing is delivered while the broker is down");

    b.kafka.broker_up(1)?;
    b.wait_count(&b.delivered(), 10).await?;
    relay.stop().await?;
    assert_commit_order(&vec![key.to_owned(); 10], &ids, &b.records()?);
    Ok(())
}

/// A relay paused past its lease; `in_flight` is A's. Returns how many
/// records reached the topic.
async fn fenced(postgres: bool, in_flight: usize) -> anyhow::Result<usize> {
    let b = bench(postgres).await?;
    let key = "fenced";
    let slice = slice_of(key);
    let first = b.append(&[key; 5]).await?;
    let (reached, resume) = (Gate::new(2), Gate::new(2));
    let faults = pause_before_progress(slice, reached.clone(), resume.clone());
    // A renews nothing while paused: its lease runs out like a stopped process's.
    let a_config = RelayConfig { renew_every: Duration::from_secs(3600), lease: Duration::from_secs(60), in_flight, ..config("relay-a") };
    let a = b.start(with_faults(a_config, faults))?;
    reached.arrive_and_wait().await; // A published its batch and waits before recording it.

    let later = b.append(&[key; 5]).await?;
    // Time passes beyond A's lease (made deterministic by expiring it).
    sqlx::query("UPDATE relay_slices SET claim_expires_at_ms = 0 WHERE slice = $1").bind(slice).execute(b.db.pool()).await?;
    // B is another process: its own pool (on SQLite, its own connection).
    let takeover = b.start_on(Db::connect(&b.test_db.url).await?, config("relay-b"))?;
    b.wait_count(&b.delivered(), 10).await?;
    let before = slice_row(&b.db, slice).await?;
    assert_eq!(before.owner, "relay-b");

    resume.arrive_and_wait().await; // A wakes up and tries to record its batch.
    wait_until("A's write refused", || async { Ok(stat(&a.stats.fenced) == 1) }).await?;
    assert_eq!(slice_row(&b.db, slice).await?, before, "the takeover relay's progress stands");
    assert_eq!(stat(&a.stats.delivered), 0, "A recorded nothing of that slice");
    takeover.stop().await?;
    a.stop().await?;

    let records = b.records()?;
    let all: Vec<String> = first.iter().chain(&later).cloned().collect();
    assert_eq!(first_occurrences_by_key(&records)[key], all, "order holds across the takeover");
    Ok(records.len())
}

async fn slice_row(db: &Db, slice: i32) -> anyhow::Result<store::Claim> {
    Ok(store::slices(db).await?.into_iter().find(|c| c.slice == slice).expect("slice row"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_paused_past_its_lease_cannot_record_progress_postgres() -> anyhow::Result<()> {
    assert_eq!(fenced(true, 1).await?, 15, "A's batch of 5 went out twice: at-least-once, same ids");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_paused_past_its_lease_cannot_record_progress_sqlite() -> anyhow::Result<()> {
    assert_eq!(fenced(false, 1).await?, 15, "A's batch of 5 went out twice: at-least-once, same ids");
    Ok(())
}

/// With two batches out, A — woken, its progress write not yet refused —
/// reads and sends the rows B already published: the price of not waiting
/// for each write is a batch of duplicates behind a lost lease, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_relay_with_two_batches_out_sends_one_more_before_its_write_is_refused() -> anyhow::Result<()> {
    assert_eq!(fenced(true, 2).await?, 20, "A's batch twice, and the next once more from A");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_row_committed_late_is_published_after_what_committed_before_it() -> anyhow::Result<()> {
    let b = bench(true).await?;
    let relay = b.start(config("late"))?;
    // T1 takes the lower sequence but commits last.
    let late = b.event("late", b"t1");
    let mut t1 = b.db.begin().await?;
    let late_seq = outbox::append(&mut t1, &late).await?;
    let early = b.append(&["late"]).await?;
    wait_until("T2's row delivered", || async { Ok(b.status_of(&early[0]).await?.0 == outbox::DELIVERED) }).await?;
    // The cursor moved past T2's sequence; T1's row must not be skipped.
    t1.commit().await?;
    wait_until("T1's row delivered", || async { Ok(b.status_of(&late.id).await?.0 == outbox::DELIVERED) }).await?;
    relay.stop().await?;

    let early_seq = b.count(&format!("SELECT seq AS n FROM outbox WHERE event_id = '{}'", early[0])).await?;
    assert!(late_seq < early_seq, "T1 holds the lower sequence");
    assert_eq!(first_occurrences_by_key(&b.records()?)["late"], vec![early[0].clone(), late.id.clone()], "commit order");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn retries_exhausted_dead_letter_the_row_and_redrive_publishes_it() -> anyhow::Result<()> {
    let b = bench(true).await?;
    let refused = RDKafkaRespErr::RD_KAFKA_RESP_ERR_POLICY_VIOLATION;
    b.kafka.produce_errors(&[refused, refused])?;
    let ids = b.append(&["dlq"]).await?;
    let relay = b.start(RelayConfig { max_attempts: 2, ..config("dlq") })?;
    wait_until("dead-lettered", || async { Ok(b.status_of(&ids[0]).await?.0 == outbox::DEAD_LETTERED) }).await?;
    let listed = outbox::list(&b.db, outbox::DEAD_LETTERED, 10).await?;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].event_id, ids[0]);
    assert_eq!(listed[0].attempts, 2);
    assert!(listed[0].last_error.as_deref().is_some_and(|e| e.contains("olicy")), "{:?}", listed[0].last_error);

    let moved = outbox::redrive(&b.db, &[listed[0].seq]).await?;
    assert_eq!(moved.len(), 1);
    assert!(moved[0].1 > moved[0].0, "re-appended behind everything else");
    b.wait_count(&b.delivered(), 1).await?;
    relay.stop().await?;
    let records = b.records()?;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].ce_id, ids[0], "redriven with the same CloudEvents id");
    // Only set-aside rows are redriven.
    assert!(outbox::redrive(&b.db, &[moved[0].1]).await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_too_large_is_failed_not_delivered_and_its_key_goes_on() -> anyhow::Result<()> {
    for postgres in [true, false] {
        let b = bench(postgres).await?;
        let big = b.event("big", &vec![7u8; 2 * 1024 * 1024]);
        let mut tx = b.db.begin().await?;
        outbox::append(&mut tx, &big).await?;
        tx.commit().await?;
        let after = b.append(&["big", "other"]).await?;
        let relay = b.start(config("big"))?;
        b.wait_count(&b.delivered(), 2).await?;
        wait_until("set aside", || async { Ok(b.status_of(&big.id).await?.0 == outbox::FAILED) }).await?;
        relay.stop().await?;
        let (_, attempts) = b.status_of(&big.id).await?;
        assert_eq!(attempts, 1, "a permanent error is not retried");
        let records = b.records()?;
        assert!(records.iter().all(|r| r.ce_id != big.id), "never reported as published");
        assert_eq!(first_occurrences_by_key(&records)["big"], vec![after[0].clone()]);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_wakes_an_idle_relay_without_waiting_for_its_poll() -> anyhow::Result<()> {
    let b = bench(true).await?;
    // Polling alone would take a minute: only the NOTIFY can be this quick.
    let relay = b.start(RelayConfig { idle_max: Duration::from_secs(60), ..config("notify") })?;
    // Listening, and every slice read once, found nothing and now waits.
    wait_until("listening and idle", || async { Ok(stat(&relay.stats.listening) == 1 && stat(&relay.stats.idle) >= 16) }).await?;
    let started = std::time::Instant::now();
    let idle_before = stat(&relay.stats.idle);
    let second = b.append(&["notify"]).await?;
    wait_until("the row delivered", || async { Ok(b.status_of(&second[0]).await?.0 == outbox::DELIVERED) }).await?;
    assert!(started.elapsed() < Duration::from_secs(10), "woken after {:?}", started.elapsed());
    // The notification names the slice written: the others sleep on (each
    // woken slice would read, find nothing and wait again).
    wait_until("the woken slice idle again", || async { Ok(stat(&relay.stats.idle) > idle_before) }).await?;
    let woken = stat(&relay.stats.idle) - idle_before;
    assert!(woken < 16, "{woken} slices woke for one row");
    relay.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topic_the_broker_does_not_have_is_not_a_success() -> anyhow::Result<()> {
    // The real broker: it does not create topics on demand (the mock does).
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let brokers = herald_testkit::real_broker()?;
    let event = relay_support::event_for("missing", &herald_testkit::unique("no-such-topic"));
    let mut tx = db.begin().await?;
    outbox::append(&mut tx, &event).await?;
    tx.commit().await?;
    let config = RelayConfig {
        max_attempts: 1,
        // Give up on the topic after 1 s instead of librdkafka's 30 s.
        producer: vec![("topic.metadata.propagation.max.ms".into(), "1000".into())],
        ..config("missing-topic")
    };
    let relay = herald_relay::Relay::new(db.clone(), &KafkaConfig::new(&brokers), config)?;
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    let status = || async {
        let row = sqlx::query("SELECT status, last_error FROM outbox WHERE event_id = $1").bind(&event.id).fetch_one(db.pool()).await?;
        anyhow::Ok((sqlx::Row::try_get::<String, _>(&row, "status")?, sqlx::Row::try_get::<Option<String>, _>(&row, "last_error")?))
    };
    wait_until("dead-lettered", || async { Ok(status().await?.0 == outbox::DEAD_LETTERED) }).await?;
    stop.cancel();
    task.await?;
    let (_, error) = status().await?;
    assert!(error.as_deref().is_some_and(|e| e.contains("Unknown topic") || e.contains("UnknownTopic")), "{error:?}");
    Ok(())
}
