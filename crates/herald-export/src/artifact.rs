//! Result files. Each attempt writes its own candidate under a key no other
//! attempt uses, with a create-only put, so no attempt can overwrite another's
//! file or the selected result.

use std::path::Path;
use std::sync::Arc;

use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
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
        std::fs::create_dir_all(dir)
            .map_err(|e| ExportError::Invalid(format!("artifact dir {}: {e}", dir.display())))?;
        Ok(ArtifactStore { store: Arc::new(LocalFileSystem::new_with_prefix(dir)?) })
    }

    pub fn new(store: Arc<dyn ObjectStore>) -> ArtifactStore {
        ArtifactStore { store }
    }

    /// Writes `content` as attempt `attempt`'s candidate for `job`, then checks
    /// the stored object's size before anyone may select it.
    pub async fn put_candidate(&self, job: &Job, attempt: &str, content: Vec<u8>) -> Result<StoredArtifact, ExportError> {
        let result_id = format!("exports/{}/{}.{}", job.job_id, attempt, job.format);
        let path = ObjectPath::from(result_id.as_str());
        let sha256 = hex(&Sha256::digest(&content));
        let size = content.len();
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        self.store.put_opts(&path, PutPayload::from(content), options).await?;
        let meta = self.store.head(&path).await?;
        if meta.size as usize != size {
            return Err(ExportError::Invalid(format!("artifact {result_id}: stored {} bytes, wrote {size}", meta.size)));
        }
        Ok(StoredArtifact { result_id, size_bytes: size as i64, sha256 })
    }

    pub async fn read(&self, result_id: &str) -> Result<bytes::Bytes, ExportError> {
        Ok(self.store.get(&ObjectPath::from(result_id)).await?.bytes().await?)
    }
}

/// The export's content. The reference domain has no real data source, so a
/// deterministic table derived from the query stands in for one.
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
