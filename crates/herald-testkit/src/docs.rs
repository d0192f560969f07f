//! The repository's documents as tests read them: a page whose code blocks
//! a test runs or checks is read here, so every test agrees on what a block
//! is.

use std::path::PathBuf;

use anyhow::Context as _;

/// `relative` under the repository's root.
pub fn path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

/// The text of the document at `relative`.
pub fn read(relative: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path(relative)).with_context(|| format!("reading {relative}"))
}

/// The fenced code blocks of the Markdown document at `relative`, in order:
/// `(language, text)`.
pub fn blocks(relative: &str) -> anyhow::Result<Vec<(String, String)>> {
    let doc = read(relative)?;
    let mut out = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(lang) = line.strip_prefix("```") else { continue };
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        out.push((lang.to_owned(), body.join("\n")));
    }
    Ok(out)
}

/// The one `lang` block of `relative` that contains `marker`.
pub fn block(relative: &str, lang: &str, marker: &str) -> anyhow::Result<String> {
    blocks(relative)?
        .into_iter()
        .find(|(l, text)| l == lang && text.contains(marker))
        .map(|(_, text)| text)
        .ok_or_else(|| anyhow::anyhow!("{relative} has no {lang} block with {marker:?}"))
}
