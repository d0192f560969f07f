//! A Kafka record with arbitrary headers and value through the consumer's
//! decoder (CloudEvents binary mode, or the legacy envelope without `ce_*`).
//! Header names are mostly drawn from the ones the binding reads, so the
//! fuzzer spends its time past "not a CloudEvent".
#![no_main]

use herald_envelope::decode_any;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

const NAMES: &[&str] = &[
    "ce_id", "ce_source", "ce_type", "ce_specversion", "ce_subject", "ce_time", "ce_dataschema",
    "content-type", "ce_datacontenttype", "ce_extension",
];

#[derive(Debug, Arbitrary)]
struct Record {
    headers: Vec<(u8, String, Option<Vec<u8>>)>,
    value: Option<Vec<u8>>,
}

fuzz_target!(|r: Record| {
    let mut headers = OwnedHeaders::new();
    for (pick, free, value) in &r.headers {
        let key = NAMES.get(usize::from(*pick)).copied().unwrap_or(free.as_str());
        headers = headers.insert(Header { key, value: value.as_deref() });
    }
    let msg = OwnedMessage::new(r.value, None, "t".into(), Timestamp::NotAvailable, 0, 0, Some(headers));
    if let Ok(event) = decode_any(&msg) {
        // A decoded event's data must decode or fail cleanly too.
        let _ = event.data_as::<herald_envelope::ExportCompleted>();
    }
});
