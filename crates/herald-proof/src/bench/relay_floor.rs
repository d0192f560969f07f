//! The floor under any relay of this outbox: what moving the backlog costs
//! when nothing of a relay's own work is done. One `COPY … TO STDOUT (FORMAT
//! binary)` of every pending row's relay columns in commit order (the
//! cheapest way PostgreSQL hands rows to a client: no slices, no snapshots,
//! no per-column type checks), each row made into the event the relay would
//! publish and sent as the raw producer sends it, every delivery report
//! awaited, no progress recorded anywhere.
//!
//! On a machine whose cores the raw producer already fills, this is the
//! most a relay can reach over the raw producer in the same run: it pays the
//! producer's cost plus the database's. If the floor's ratio is below a
//! target, the target is beyond the machine, not beyond Herald.

use std::time::Instant;

use anyhow::Context;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use herald_envelope::OutboxEvent;
use herald_kafka::KafkaConfig;
use herald_store::Db;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use super::cpu::CpuMark;
use super::relay::Run;

/// The columns an event is made of, in the order [`event_of`] reads them.
const COLUMNS: &str = "seq, event_id, source, event_type, subject, event_time_ms, schema_file, data, \
     topic, partition_key, traceparent, tracestate, content_type, extensions";
const COLUMN_COUNT: usize = 14;
const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

/// Sends the `want` pending rows of `db`'s outbox (written there by the
/// caller) to `topic`, as described above.
pub(crate) async fn floor_relay(db: &Db, kafka: &KafkaConfig, want: u64) -> anyhow::Result<Run> {
    let pool = db.native_postgres(1)?.context("the floor reads from PostgreSQL")?;
    let producer: FutureProducer = herald_relay::producer_config(kafka).create()?;
    let mut conn = pool.acquire().await?;
    let (started, mark) = (Instant::now(), CpuMark::now());
    let statement = format!("COPY (SELECT {COLUMNS} FROM outbox WHERE status = 'pending' ORDER BY xid, seq) TO STDOUT (FORMAT binary)");
    let mut stream = conn.copy_out_raw(&statement).await?;
    let (mut buffer, mut deliveries) = (Vec::<u8>::new(), Vec::with_capacity(want as usize));
    let mut header_read = false;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if header_read && buffer.is_empty() {
            // The usual case, a message of whole rows: read in place.
            let at = send_whole_tuples(&chunk, &producer, &mut deliveries)?;
            buffer.extend_from_slice(&chunk[at..]);
            continue;
        }
        buffer.extend_from_slice(&chunk);
        if !header_read {
            let Some(after) = header_len(&buffer)? else { continue };
            buffer.drain(..after);
            header_read = true;
        }
        let at = send_whole_tuples(&buffer, &producer, &mut deliveries)?;
        buffer.drain(..at);
    }
    drop(stream);
    let sent = deliveries.len() as u64;
    for delivery in deliveries {
        delivery.await.context("delivery report dropped")?.map_err(|(e, _)| e)?;
    }
    let (secs, cpu) = (started.elapsed().as_secs_f64(), mark.and_then(|m| m.used()));
    anyhow::ensure!(sent == want, "the floor read {sent} pending rows, expected {want}");
    Ok(Run::new(sent, secs, cpu))
}

/// Sends the event of every whole tuple at the start of `buffer`; returns
/// the bytes they took (a tuple still arriving stays for the next chunk).
fn send_whole_tuples(buffer: &[u8], producer: &FutureProducer, deliveries: &mut Vec<DeliveryFuture>) -> anyhow::Result<usize> {
    let mut at = 0;
    while let Tuple::Row(fields, len) = tuple(&buffer[at..])? {
        at += len;
        let event = event_of(&fields)?;
        let headers = event.to_kafka_headers_under(None)?;
        let record = FutureRecord::to(&event.topic).key(event.partition_key.as_str()).payload(&event.data).headers(headers);
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    // The trailer (or a tuple still arriving) is left in the buffer: the
    // stream ends after it.
    Ok(at)
}

/// What the start of a buffer holds.
#[derive(Debug, PartialEq)]
enum Tuple<'a> {
    /// A row's fields (`None`: NULL) and the bytes it took.
    Row(Vec<Option<&'a [u8]>>, usize),
    /// The trailer: no rows follow.
    End,
    /// Not all of the next tuple has arrived.
    Partial,
}

/// The length of a binary COPY header at the start of `buffer`, once all of
/// it arrived.
fn header_len(buffer: &[u8]) -> anyhow::Result<Option<usize>> {
    let fixed = SIGNATURE.len() + 8;
    if buffer.len() < fixed {
        return Ok(None);
    }
    anyhow::ensure!(buffer.starts_with(SIGNATURE), "not a binary COPY stream");
    let extension = u32::from_be_bytes(buffer[fixed - 4..fixed].try_into()?) as usize;
    Ok((buffer.len() >= fixed + extension).then_some(fixed + extension))
}

/// The tuple at the start of `buffer`.
fn tuple(buffer: &[u8]) -> anyhow::Result<Tuple<'_>> {
    let Some(count) = buffer.get(..2) else { return Ok(Tuple::Partial) };
    let count = i16::from_be_bytes(count.try_into()?);
    if count == -1 {
        return Ok(Tuple::End);
    }
    let mut fields = Vec::with_capacity(count.max(0) as usize);
    let mut at = 2;
    for _ in 0..count {
        let Some(len) = buffer.get(at..at + 4) else { return Ok(Tuple::Partial) };
        let len = i32::from_be_bytes(len.try_into()?);
        at += 4;
        if len < 0 {
            fields.push(None);
            continue;
        }
        let Some(value) = buffer.get(at..at + len as usize) else { return Ok(Tuple::Partial) };
        fields.push(Some(value));
        at += len as usize;
    }
    Ok(Tuple::Row(fields, at))
}

/// The event a relay would publish for one tuple of [`COLUMNS`].
fn event_of(fields: &[Option<&[u8]>]) -> anyhow::Result<OutboxEvent> {
    anyhow::ensure!(fields.len() == COLUMN_COUNT, "a tuple of {} fields, expected {COLUMN_COUNT}", fields.len());
    let bytes = |i: usize| fields[i].with_context(|| format!("column {i} is NULL"));
    let text = |i: usize| -> anyhow::Result<String> { Ok(std::str::from_utf8(bytes(i)?)?.to_owned()) };
    let time_ms = i64::from_be_bytes(bytes(5)?.try_into()?);
    let extensions = match fields[13] {
        None => Default::default(),
        Some(json) => serde_json::from_slice(json)?,
    };
    let traceparent = fields[10].map(std::str::from_utf8).transpose()?;
    let tracestate = fields[11].map(std::str::from_utf8).transpose()?;
    Ok(OutboxEvent {
        id: text(1)?,
        source: text(2)?,
        event_type: text(3)?,
        subject: text(4)?,
        time: DateTime::<Utc>::from_timestamp_millis(time_ms).unwrap_or_default(),
        schema_file: text(6)?,
        data: bytes(7)?.to_vec(),
        topic: text(8)?,
        partition_key: text(9)?,
        trace: traceparent.and_then(|p| herald_envelope::TraceContext::parse(p, tracestate)),
        content_type: text(12)?,
        extensions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(out: &mut Vec<u8>, value: Option<&[u8]>) {
        match value {
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            Some(v) => {
                out.extend_from_slice(&(v.len() as i32).to_be_bytes());
                out.extend_from_slice(v);
            }
        }
    }

    #[test]
    fn a_header_waits_for_its_extension_area() {
        let mut header = SIGNATURE.to_vec();
        header.extend_from_slice(&0u32.to_be_bytes());
        header.extend_from_slice(&3u32.to_be_bytes());
        assert_eq!(header_len(&header).unwrap(), None);
        header.extend_from_slice(b"abc");
        assert_eq!(header_len(&header).unwrap(), Some(22));
        assert!(header_len(b"COPY-OF-SOMETHING-ELSE").is_err());
    }

    #[test]
    fn a_tuple_split_across_chunks_is_read_once_whole() {
        let mut row = 3i16.to_be_bytes().to_vec();
        field(&mut row, Some(b"ab"));
        field(&mut row, None);
        field(&mut row, Some(b""));
        for cut in 0..row.len() {
            assert_eq!(tuple(&row[..cut]).unwrap(), Tuple::Partial, "read a tuple from its first {cut} bytes");
        }
        assert_eq!(tuple(&row).unwrap(), Tuple::Row(vec![Some(&b"ab"[..]), None, Some(&b""[..])], row.len()));
        assert_eq!(tuple(&(-1i16).to_be_bytes()).unwrap(), Tuple::End);
    }

    #[test]
    fn an_event_is_made_of_the_columns_in_their_order() {
        let time = 1_700_000_000_123i64.to_be_bytes();
        let values: [Option<&[u8]>; COLUMN_COUNT] = [
            Some(&7i64.to_be_bytes()),
            Some(b"id-1"),
            Some(b"/src"),
            Some(b"t.v1"),
            Some(b"job-1"),
            Some(&time),
            Some(b"x.avsc"),
            Some(b"\x01\x02"),
            Some(b"topic"),
            Some(b"key"),
            None,
            None,
            Some(b"application/avro"),
            Some(br#"{"tenant":"a"}"#),
        ];
        let event = event_of(&values).unwrap();
        assert_eq!((event.id.as_str(), event.source.as_str(), event.subject.as_str()), ("id-1", "/src", "job-1"));
        assert_eq!((event.topic.as_str(), event.partition_key.as_str(), event.data.as_slice()), ("topic", "key", &[1u8, 2][..]));
        assert_eq!(event.time.timestamp_millis(), 1_700_000_000_123);
        assert_eq!(event.extensions.get("tenant").map(String::as_str), Some("a"));
        assert!(event_of(&values[..13]).is_err());
    }
}
