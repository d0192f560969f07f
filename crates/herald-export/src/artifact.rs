//! Result files. Each attempt writes its own candidate under a key no other
//! attempt uses, with a create-only put, so no attempt can overwrite another's
//! file or the selected result.

use std::path::Path;
use std::sync::Arc;

use futures::stream::BoxStream;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use sha2::{Digest, Sha256};

use crate::intake::hex;
use crate::{ExportError, Job};

/// A candidate result, verified complete in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredArtifact {
    pub result_id: String,
    pub size_bytes: i64,
    pub sha256: String,
}

#[derive(Clone)]
pub struct ArtifactStore {
    store: Arc<dyn ObjectStore>,
}

impl ArtifactStore {
    /// Artifacts as files under `dir` (created if missing).
    pub fn local(dir: &Path) -> Result<ArtifactStore, ExportError> {
        std::fs::create_dir_all(dir).map_err(|e| ExportError::Invalid(format!("artifact dir {}: {e}", dir.display())))?;
        Ok(ArtifactStore { store: Arc::new(LocalFileSystem::new_with_prefix(dir)?) })
    }

    pub fn new(store: Arc<dyn ObjectStore>) -> ArtifactStore {
        ArtifactStore { store }
    }

    /// Artifacts where `location` says: a directory path or `file://` URL for
    /// the local filesystem, or `s3://bucket[/prefix]` for an S3-compatible
    /// store configured by the usual `AWS_*` variables (`AWS_ENDPOINT`,
    /// `AWS_ALLOW_HTTP`, credentials, region). Create-only puts on S3 use
    /// conditional writes (`If-None-Match: *`), which the store must support.
    pub fn from_location(location: &str) -> Result<ArtifactStore, ExportError> {
        ArtifactStore::from_location_with(location, &[])
    }

    /// As [`ArtifactStore::from_location`], with S3 settings given as
    /// `aws_*` option pairs (e.g. `("aws_endpoint", "http://…")`) over the
    /// environment's.
    pub fn from_location_with(location: &str, s3_options: &[(&str, &str)]) -> Result<ArtifactStore, ExportError> {
        let Some(rest) = location.strip_prefix("s3://") else {
            let dir = location.strip_prefix("file://").unwrap_or(location);
            return ArtifactStore::local(Path::new(dir));
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(ExportError::Invalid(format!("artifact location `{location}` names no bucket")));
        }
        let mut builder = AmazonS3Builder::from_env();
        for (key, value) in s3_options {
            let key = key.parse().map_err(|e| ExportError::Invalid(format!("S3 option `{key}`: {e}")))?;
            builder = builder.with_config(key, *value);
        }
        let s3 = builder.with_bucket_name(bucket).with_conditional_put(S3ConditionalPut::ETagMatch).build()?;
        let store: Arc<dyn ObjectStore> =
            if prefix.trim_matches('/').is_empty() { Arc::new(s3) } else { Arc::new(PrefixStore::new(s3, prefix.trim_matches('/'))) };
        Ok(ArtifactStore { store })
    }

    /// The key attempt `generation` of `job` writes its candidate under; no
    /// other attempt shares it.
    pub fn candidate_key(job: &Job, generation: i64) -> String {
        format!("exports/{}/g{generation}.{}", job.job_id, job.format)
    }

    /// Writes `content` under `result_id` with a create-only put, then reads
    /// it back and checks size and sha256 before anyone may select it.
    pub async fn put_candidate(&self, result_id: &str, content: Vec<u8>) -> Result<StoredArtifact, ExportError> {
        let path = ObjectPath::from(result_id);
        let sha256 = hex(&Sha256::digest(&content));
        let size = content.len();
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        self.store.put_opts(&path, PutPayload::from(content), options).await?;
        let stored = self.store.get(&path).await?.bytes().await?;
        let corrupt = |reason: String| ExportError::ArtifactCorrupt { result_id: result_id.to_owned(), reason };
        if stored.len() != size {
            return Err(corrupt(format!("stored {} bytes, wrote {size}", stored.len())));
        }
        if hex(&Sha256::digest(&stored)) != sha256 {
            return Err(corrupt("sha256 differs from what was written".into()));
        }
        Ok(StoredArtifact { result_id: result_id.to_owned(), size_bytes: size as i64, sha256 })
    }

    /// The stored bytes as a stream, for serving a result without loading it.
    pub async fn open(&self, result_id: &str) -> Result<BoxStream<'static, object_store::Result<bytes::Bytes>>, ExportError> {
        Ok(self.store.get(&ObjectPath::from(result_id)).await?.into_stream())
    }

    pub async fn exists(&self, result_id: &str) -> Result<bool, ExportError> {
        match self.store.head(&ObjectPath::from(result_id)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes a file; one already gone counts as removed.
    pub async fn delete(&self, result_id: &str) -> Result<(), ExportError> {
        match self.store.delete(&ObjectPath::from(result_id)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// The export's content. The reference domain has no real data source, so a
/// deterministic table derived from the query stands in for one.
/// Media type of a result file of `format`, as [`render`] writes it.
pub fn content_type(format: &str) -> &'static str {
    match format {
        "json" => "application/json",
        _ => "text/csv",
    }
}

pub fn render(job: &Job) -> Vec<u8> {
    let rows = (1..=10).map(|n| (n, format!("{} #{n}", job.query)));
    match job.format.as_str() {
        "json" => {
            let items: Vec<_> = rows.map(|(n, text)| serde_json::json!({"row": n, "text": text})).collect();
            serde_json::to_vec(&items).unwrap_or_default()
        }
        _ => {
            let mut out = String::from("row,text\n");
            for (n, text) in rows {
                out.push_str(&format!("{n},\"{}\"\n", text.replace('"', "\"\"")));
            }
            out.into_bytes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn candidates_are_create_only_and_verified() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::from_location(&format!("file://{}", dir.path().display())).unwrap();
        let stored = store.put_candidate("exports/j/g1.csv", b"a,b\n".to_vec()).await.unwrap();
        assert_eq!(stored.size_bytes, 4);
        assert_eq!(stored.sha256.len(), 64);
        let again = store.put_candidate("exports/j/g1.csv", b"other".to_vec()).await;
        assert!(matches!(again, Err(ExportError::Artifact(object_store::Error::AlreadyExists { .. }))), "{again:?}");
        assert!(store.exists("exports/j/g1.csv").await.unwrap());
        store.delete("exports/j/g1.csv").await.unwrap();
        store.delete("exports/j/g1.csv").await.unwrap();
        assert!(!store.exists("exports/j/g1.csv").await.unwrap());
    }

    #[test]
    fn s3_location_needs_a_bucket() {
        assert!(matches!(ArtifactStore::from_location("s3://"), Err(ExportError::Invalid(_))));
    }
}
