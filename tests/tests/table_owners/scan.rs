//! What `table_owners` reads out of source files: the SQL statements that
//! write a table, found in a Rust file's string literals (comments and
//! `#[cfg(test)]` items skipped), and the tables migrations leave behind.
//!
//! The scanner knows just enough Rust to tell literals from code: plain,
//! byte and raw strings, char literals from lifetimes, nested block
//! comments. Statements are matched on words, case-insensitively, inside one
//! literal (a multi-line literal counts as one), so `ON CONFLICT … DO
//! UPDATE`, `FOR UPDATE` and `INSERT OR REPLACE INTO` are read as SQL reads
//! them.

use std::collections::BTreeSet;

/// One statement writing a table.
#[derive(Debug, PartialEq, Eq)]
pub struct Write {
    /// 1-based line of the statement's first word.
    pub line: usize,
    pub verb: &'static str,
    /// Lower case, schema prefix dropped; a format placeholder such as
    /// `{table}` stays as written (see [`Write::is_dynamic`]).
    pub table: String,
}

impl Write {
    /// The table is named at run time (a format argument), not in the text.
    pub fn is_dynamic(&self) -> bool {
        self.table.contains('{')
    }
}

/// Every `INSERT [OR …] INTO t`, `REPLACE INTO t`, `UPDATE t [[AS] a] SET`,
/// `DELETE FROM t` and `CREATE TABLE t` in `source`'s string literals outside
/// `#[cfg(test)]` items. An `UPDATE t` closing its literal counts too: the
/// rest of the statement may follow in a format argument.
pub fn writes(source: &str) -> Vec<Write> {
    let lexed = lex(source);
    let skipped = test_items(&lexed.code);
    let lines = LineIndex::new(source);
    let mut found = Vec::new();
    for &(start, ref text) in &lexed.literals {
        if skipped.iter().any(|r| r.contains(&start)) {
            continue;
        }
        for (offset, verb, table) in statements(&words(text)) {
            found.push(Write { line: lines.line_of(start + offset), verb, table });
        }
    }
    found
}

/// The tables a sequence of migration scripts leaves: `CREATE TABLE` adds,
/// `DROP TABLE` removes, `ALTER TABLE a RENAME TO b` renames (SQLite rebuilds
/// a table that way).
pub fn migrated_tables<'a>(scripts: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    let mut tables = BTreeSet::new();
    for script in scripts {
        let text: String = script.lines().map(|l| l.split("--").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
        let w: Vec<String> = words(&text).into_iter().map(|(_, w)| w).collect();
        let at = |i: usize| w.get(i).map(String::as_str).unwrap_or("");
        for i in 0..w.len() {
            match (at(i), at(i + 1)) {
                ("create", "table") => {
                    tables.insert(table_name(&w, i + 2));
                }
                ("drop", "table") => {
                    tables.remove(&table_name(&w, i + 2));
                }
                ("alter", "table") if at(i + 3) == "rename" && at(i + 4) == "to" => {
                    tables.remove(&table_name(&w, i + 2));
                    tables.insert(table_name(&w, i + 5));
                }
                _ => {}
            }
        }
    }
    tables
}

/// The table named at `w[i]`, past `IF [NOT] EXISTS` and `ONLY`, without a
/// schema prefix or a full stop after it.
fn table_name(w: &[String], mut i: usize) -> String {
    while matches!(w.get(i).map(String::as_str), Some("if" | "not" | "exists" | "only")) {
        i += 1;
    }
    let name = w.get(i).map(String::as_str).unwrap_or("").trim_end_matches('.');
    name.rsplit('.').next().unwrap_or(name).to_owned()
}

fn statements(words: &[(usize, String)]) -> Vec<(usize, &'static str, String)> {
    let w: Vec<String> = words.iter().map(|(_, w)| w.clone()).collect();
    let at = |i: usize| w.get(i).map(String::as_str).unwrap_or("");
    let mut found = Vec::new();
    for (i, &(offset, _)) in words.iter().enumerate() {
        let before = if i == 0 { "" } else { at(i - 1) };
        let statement = match at(i) {
            "insert" => {
                let into = if at(i + 1) == "or" { i + 3 } else { i + 1 };
                (at(into) == "into").then(|| ("INSERT", table_name(&w, into + 1)))
            }
            "replace" if before != "or" && at(i + 1) == "into" => Some(("INSERT", table_name(&w, i + 2))),
            // `DO UPDATE` (upsert), `FOR [NO KEY] UPDATE` (row locks), `ON UPDATE` (foreign keys).
            "update" if !matches!(before, "do" | "for" | "key" | "on") => {
                let sets = [i + 2, i + 3, i + 4].iter().any(|&j| at(j) == "set") || i + 2 == w.len();
                sets.then(|| ("UPDATE", table_name(&w, i + 1)))
            }
            "delete" if at(i + 1) == "from" => Some(("DELETE", table_name(&w, i + 2))),
            "create" if matches!(at(i + 1), "table" | "temp" | "temporary") => {
                let table = if at(i + 1) == "table" { i + 2 } else { i + 3 };
                Some(("CREATE TABLE", table_name(&w, table)))
            }
            _ => None,
        };
        if let Some((verb, table)) = statement.filter(|(_, t)| !t.is_empty()) {
            found.push((offset, verb, table));
        }
    }
    found
}

/// Lower-cased words of `text` with their byte offsets: letters, digits,
/// `_`, `.` (schema prefixes) and `{}` (format placeholders).
fn words(text: &str) -> Vec<(usize, String)> {
    let is_word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '{' | '}');
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, c) in text.char_indices() {
        match (&mut current, is_word(c)) {
            (Some((_, word)), true) => word.push(c.to_ascii_lowercase()),
            (None, true) => current = Some((i, c.to_ascii_lowercase().to_string())),
            (Some(_), false) => out.extend(current.take()),
            (None, false) => {}
        }
    }
    out.extend(current);
    out
}

struct Lexed {
    /// The source with every literal and comment byte blanked (newlines kept).
    code: Vec<u8>,
    /// Each string literal's content: its byte offset in the source and its
    /// text with escapes blanked, byte for byte, so offsets stay the source's.
    literals: Vec<(usize, String)>,
}

fn lex(source: &str) -> Lexed {
    let b = source.as_bytes();
    let mut code = b.to_vec();
    let mut literals = Vec::new();
    let blank = |code: &mut Vec<u8>, from: usize, to: usize| {
        for byte in &mut code[from..to.min(b.len())] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    };
    let ident = |i: usize| i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = source[i..].find('\n').map_or(b.len(), |n| i + n);
                blank(&mut code, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let (mut depth, mut j) = (1, i + 2);
                while j < b.len() && depth > 0 {
                    if b[j..].starts_with(b"/*") {
                        depth += 1;
                        j += 1;
                    } else if b[j..].starts_with(b"*/") {
                        depth -= 1;
                        j += 1;
                    }
                    j += 1;
                }
                blank(&mut code, i, j);
                i = j;
            }
            b'r' if !ident(i) || (i >= 1 && b[i - 1] == b'b' && !ident(i - 1)) => {
                let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
                if b.get(i + 1 + hashes) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let start = i + 2 + hashes;
                let close = format!("\"{}", "#".repeat(hashes));
                let end = source[start..].find(&close).map_or(b.len(), |n| start + n);
                literals.push((start, source[start..end].to_owned()));
                blank(&mut code, start, end);
                i = end + close.len();
            }
            b'"' => {
                let start = i + 1;
                let mut text = Vec::new();
                let mut j = start;
                while j < b.len() && b[j] != b'"' {
                    if b[j] == b'\\' {
                        // An escape becomes blanks of its width: `\n` or a
                        // line continuation separates words like the
                        // whitespace it stands for.
                        text.push(b' ');
                        j += 1;
                        if j < b.len() {
                            text.push(if b[j] == b'\n' { b'\n' } else { b' ' });
                        }
                    } else {
                        text.push(b[j]);
                    }
                    j += 1;
                }
                literals.push((start, String::from_utf8_lossy(&text).into_owned()));
                blank(&mut code, start, j);
                i = j + 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\'') or a lifetime ('a).
                let end = if b.get(i + 1) == Some(&b'\\') {
                    source[i + 3..].find('\'').map(|n| i + 3 + n)
                } else {
                    source[i + 1..].chars().next().map(|c| i + 1 + c.len_utf8()).filter(|&j| b.get(j) == Some(&b'\''))
                };
                match end {
                    Some(end) => {
                        blank(&mut code, i + 1, end);
                        i = end + 1;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    Lexed { code, literals }
}

/// Byte ranges of items under `#[cfg(test)]`: from the attribute to the
/// brace closing the item (or its `;`), on the code with literals blanked.
fn test_items(code: &[u8]) -> Vec<std::ops::Range<usize>> {
    let needle = b"#[cfg(test)]";
    let mut ranges = Vec::new();
    let mut i = 0;
    while let Some(n) = code[i..].windows(needle.len()).position(|w| w == needle) {
        let start = i + n;
        let mut j = start + needle.len();
        let mut depth = 0usize;
        while j < code.len() {
            match code[j] {
                b'{' => depth += 1,
                b'}' if depth == 1 => break,
                b'}' => depth = depth.saturating_sub(1),
                b';' if depth == 0 => break,
                _ => {}
            }
            j += 1;
        }
        ranges.push(start..j + 1);
        i = j + 1;
        if i >= code.len() {
            break;
        }
    }
    ranges
}

struct LineIndex(Vec<usize>);

impl LineIndex {
    fn new(source: &str) -> LineIndex {
        LineIndex(std::iter::once(0).chain(source.match_indices('\n').map(|(i, _)| i + 1)).collect())
    }

    fn line_of(&self, offset: usize) -> usize {
        self.0.partition_point(|&start| start <= offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r####"
//! DELETE FROM in_a_doc_comment
fn f() {
    // UPDATE in_a_comment SET x = 1
    /* INSERT INTO in_a /* nested */ block_comment */
    let lifetime: &'static str = "insert into Outbox (id) VALUES ($1)
        ON CONFLICT (id) DO UPDATE SET id = excluded.id";
    let c = '"'; let d = '\''; let e = "\"";
    sqlx::query(r#"UPDATE
        export_jobs AS j SET status = 'x' WHERE id IN (SELECT id FROM inbox FOR UPDATE SKIP LOCKED)"#);
    sqlx::query("INSERT OR REPLACE INTO keys (k) VALUES (?)");
    sqlx::query("WITH gone AS (DELETE FROM public.parked_records RETURNING 1) SELECT 1");
    sqlx::query("UPDATE \
                 relay_slices SET x = 1");
    format!("UPDATE {table} SET lease = NULL");
    let message = "could not update the job"; // no SET: English, not SQL
    let text = "DELETE FROM\nsearch_documents.";
    let r#type = 1; let bytes = br"CREATE TABLE IF NOT EXISTS ledger (x INTEGER)";
}
#[cfg(test)]
mod tests {
    fn g() { let _ = "DELETE FROM in_a_test_module"; }
}
fn h() { let _ = "DELETE FROM after_the_tests"; }
"####;

    #[test]
    fn finds_writes_in_literals_only() {
        let found: Vec<(usize, &str, String)> = writes(SAMPLE).into_iter().map(|w| (w.line, w.verb, w.table)).collect();
        let expected = [
            (6, "INSERT", "outbox"),
            (9, "UPDATE", "export_jobs"),
            (11, "INSERT", "keys"),
            (12, "DELETE", "parked_records"),
            (13, "UPDATE", "relay_slices"),
            (15, "UPDATE", "{table}"),
            (17, "DELETE", "search_documents"),
            (18, "CREATE TABLE", "ledger"),
            (24, "DELETE", "after_the_tests"),
        ];
        let expected: Vec<(usize, &str, String)> = expected.iter().map(|&(l, v, t)| (l, v, t.to_owned())).collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn migrations_leave_created_and_renamed_tables() {
        let first = "CREATE TABLE a (x INT); -- CREATE TABLE in_a_comment\nCREATE TABLE IF NOT EXISTS b (y INT);";
        let second = "CREATE TABLE c_new (x INT);\nINSERT INTO c_new SELECT * FROM a;\nDROP TABLE a;\nALTER TABLE c_new RENAME TO a;\nDROP TABLE IF EXISTS b;";
        let tables: Vec<String> = migrated_tables([first, second]).into_iter().collect();
        assert_eq!(tables, ["a"]);
    }
}
