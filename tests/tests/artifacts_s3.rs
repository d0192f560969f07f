//! Artifacts in an S3-compatible store (moto on loopback): candidates are
//! create-only, verified after the write, streamed back and deletable.

use futures::TryStreamExt;
use herald_export::ExportError;
use herald_export::artifact::ArtifactStore;

#[tokio::test(flavor = "multi_thread")]
async fn s3_candidates_are_create_only_and_verified() -> anyhow::Result<()> {
    let endpoint = herald_testkit::s3_endpoint()?;
    let bucket = herald_testkit::unique("herald-artifacts");
    let created = reqwest::Client::new().put(format!("{endpoint}/{bucket}")).send().await?;
    assert!(created.status().is_success(), "bucket: {}", created.status());
    let options = [
        ("aws_endpoint", endpoint.as_str()),
        ("aws_allow_http", "true"),
        ("aws_access_key_id", "test"),
        ("aws_secret_access_key", "test"),
        ("aws_region", "us-east-1"),
    ];
    let store = ArtifactStore::from_location_with(&format!("s3://{bucket}/tenant-a"), &options)?;

    let stored = store.put_candidate("exports/job-1/g1.csv", b"row,text\n1,x\n".to_vec()).await?;
    assert_eq!(stored.size_bytes, 13);
    let again = store.put_candidate("exports/job-1/g1.csv", b"overwrite".to_vec()).await;
    assert!(matches!(again, Err(ExportError::Artifact(object_store::Error::AlreadyExists { .. }))), "{again:?}");

    let bytes: Vec<u8> = store.open("exports/job-1/g1.csv").await?.map_ok(|b| b.to_vec()).try_concat().await?;
    assert_eq!(bytes, b"row,text\n1,x\n", "the first write stands");
    store.delete("exports/job-1/g1.csv").await?;
    assert!(!store.exists("exports/job-1/g1.csv").await?);
    Ok(())
}
