//! Documents in PostgreSQL's `COPY` text format, the way a replay loads a
//! generation's own table: one line a document and the offset it arrived
//! at, columns in [`COLUMNS`]' order, tab-separated. `COPY` skips what an
//! `INSERT … SELECT FROM UNNEST(…)` costs the server per row (parsing the
//! arrays, planning, executing a statement's projection), which was most
//! of what PostgreSQL spent on a replay beyond the primary key
//! (BENCHMARKS.md, "Rebuild").
//! No database here: `load` sends the lines.

use super::DocumentRef;

/// The columns of a line: a document's as [`super::write::UNNEST_ROWS`]
/// names them, then `arrival`, which only a loading table has.
pub const COLUMNS: &str =
    "generation, job_id, caller, format, query, result_id, size_bytes, completed_at_ms, version, deleted_at_ms, arrival";

/// Appends `row` of `generation`, met at offset `arrival`, to `out` as one line.
pub fn copy_line(out: &mut Vec<u8>, generation: i64, row: DocumentRef<'_>, arrival: i64) {
    push_number(out, generation);
    for text in [row.job_id, row.caller, row.format, row.query, row.result_id] {
        out.push(b'\t');
        push_escaped(out, text);
    }
    for number in [row.size_bytes, row.completed_at_ms, row.version] {
        out.push(b'\t');
        push_number(out, number);
    }
    out.push(b'\t');
    match row.deleted_at_ms {
        Some(at) => push_number(out, at),
        None => out.extend_from_slice(b"\\N"),
    }
    out.push(b'\t');
    push_number(out, arrival);
    out.push(b'\n');
}

/// Formatted straight into `out`: four numbers a document, on a replay's
/// hot path, each a `String` of its own otherwise.
fn push_number(out: &mut Vec<u8>, number: i64) {
    use std::io::Write;
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{number}");
}

/// `text` as one column: the backslash (COPY's escape, and so also what
/// could spell `\N` or the end marker `\.`), tab, newline and carriage
/// return escaped; every other byte as it is (PostgreSQL text holds no NUL).
fn push_escaped(out: &mut Vec<u8>, text: &str) {
    let mut rest = text.as_bytes();
    // Runs without a byte to escape, most values whole, copied at once.
    while let Some(at) = rest.iter().position(|b| matches!(b, b'\\' | b'\t' | b'\n' | b'\r')) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(match rest[at] {
            b'\\' => b"\\\\",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            _ => b"\\r",
        });
        rest = &rest[at + 1..];
    }
    out.extend_from_slice(rest);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(query: &str, deleted_at_ms: Option<i64>) -> DocumentRef<'_> {
        DocumentRef {
            job_id: "job-1",
            caller: "alice",
            format: "csv",
            query,
            result_id: "r/1.csv",
            size_bytes: 42,
            completed_at_ms: -5,
            version: 3,
            deleted_at_ms,
        }
    }

    #[test]
    fn a_document_is_one_line_in_the_column_order() {
        let mut out = Vec::new();
        copy_line(&mut out, 7, row("q", None), 0);
        copy_line(&mut out, 7, row("", Some(99)), 12);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "7\tjob-1\talice\tcsv\tq\tr/1.csv\t42\t-5\t3\t\\N\t0\n7\tjob-1\talice\tcsv\t\tr/1.csv\t42\t-5\t3\t99\t12\n"
        );
        assert_eq!(COLUMNS.split(',').count(), 11);
    }

    #[test]
    fn separators_escapes_and_end_markers_inside_a_value_stay_data() {
        let mut out = Vec::new();
        push_escaped(&mut out, "a\tb\\c\nd\re \\N \\. ü");
        assert_eq!(String::from_utf8(out).unwrap(), "a\\tb\\\\c\\nd\\re \\\\N \\\\. ü");
    }
}
