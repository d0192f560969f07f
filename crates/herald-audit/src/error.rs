use thiserror::Error;

/// Why an audit could not gather its evidence. None of these is a violation:
/// the audit did not run, and says which source failed.
#[derive(Debug, Error)]
pub enum AuditError {
    /// The database could not be read: check the URL and retry.
    #[error("reading the database: {0}")]
    Database(#[from] herald_store::StoreError),
    /// The broker could not be read completely: retry when it is reachable.
    #[error("reading Kafka: {0}")]
    Kafka(String),
    /// The provider's effects could not be fetched: check the URL and retry.
    #[error("asking the notification provider: {0}")]
    Provider(String),
    /// The artifact store could not be asked: check the location and retry.
    #[error("asking the artifact store: {0}")]
    Artifacts(#[from] herald_export::ExportError),
}

impl From<sqlx::Error> for AuditError {
    fn from(e: sqlx::Error) -> Self {
        AuditError::Database(e.into())
    }
}
