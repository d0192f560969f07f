//! Arbitrary bytes as the Avro datum of each schema, read by every reader
//! type of that event (writer → reader resolution included).
#![no_main]

use herald_envelope::schema::FILES;
use herald_envelope::{EventData, ExportCompleted, ExportCompletedV1, ExportDeleted, ExportFailed, ExportRequested};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (u8, &[u8])| {
    let (pick, bytes) = input;
    let (file, _) = FILES[usize::from(pick) % FILES.len()];
    let _ = ExportRequested::from_avro(file, bytes);
    let _ = ExportCompleted::from_avro(file, bytes);
    let _ = ExportCompletedV1::from_avro(file, bytes);
    let _ = ExportFailed::from_avro(file, bytes);
    let _ = ExportDeleted::from_avro(file, bytes);
});
