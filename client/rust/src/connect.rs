//! Connections: TLS (rustls) or none, and bounded pools (deadpool-postgres).
//!
//! Every connection this crate opens goes through a [`Tls`]: `Tls::Disabled` for a
//! local server, `Tls::Rustls` for one that requires TLS (every managed PostgreSQL).
//! Pools are bounded: a call that finds every connection busy waits for one (up to
//! the pool's wait timeout) instead of opening more.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio_postgres::{Client as PgClient, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::Error;

/// How connections are secured.
#[derive(Clone, Debug, Default)]
pub enum Tls {
    /// Plain TCP or a Unix socket (`sslmode` is ignored).
    #[default]
    Disabled,
    /// TLS with this rustls configuration (the server's certificate is verified against
    /// its roots). Set `sslmode=require` in the `Config` to refuse a plain connection.
    Rustls(Arc<rustls::ClientConfig>),
}

impl Tls {
    /// TLS that trusts the certificates of a PEM file (a private CA, or the bundle a
    /// managed service publishes), with the ring crypto provider.
    pub fn from_pem_file(path: impl AsRef<Path>) -> Result<Tls, Error> {
        let path = path.as_ref();
        let refused = |what: String| Error::Protocol(format!("{}: {}", path.display(), what));
        let mut roots = rustls::RootCertStore::empty();
        let certificates =
            CertificateDer::pem_file_iter(path).map_err(|e| refused(e.to_string()))?;
        for certificate in certificates {
            let certificate = certificate.map_err(|e| refused(e.to_string()))?;
            roots.add(certificate).map_err(|e| refused(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(refused("no certificate in the file".into()));
        }
        Tls::with_roots(roots)
    }

    /// TLS that trusts these roots, with the ring crypto provider.
    pub fn with_roots(roots: rustls::RootCertStore) -> Result<Tls, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Protocol(format!("TLS configuration: {}", e)))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls::Rustls(Arc::new(config)))
    }

    /// One connection, its connection task spawned on the current tokio runtime.
    pub async fn connect(&self, config: &Config) -> Result<PgClient, Error> {
        match self {
            Tls::Disabled => {
                let (client, connection) = config.connect(NoTls).await?;
                tokio::spawn(connection);
                Ok(client)
            }
            Tls::Rustls(tls) => {
                let connector = MakeRustlsConnect::new(tls.as_ref().clone());
                let (client, connection) = config.connect(connector).await?;
                tokio::spawn(connection);
                Ok(client)
            }
        }
    }

    /// A pool of at most `max_size` connections; a caller waits at most `wait` for one
    /// (None: as long as it takes). Connections are opened on first use, on the runtime
    /// of the task that asks.
    pub fn pool(
        &self,
        config: Config,
        max_size: usize,
        wait: Option<Duration>,
    ) -> Result<Pool, Error> {
        if max_size == 0 {
            return Err(Error::Protocol("a pool needs max_size >= 1".into()));
        }
        let manager_config = ManagerConfig { recycling_method: RecyclingMethod::Fast };
        let manager = match self {
            Tls::Disabled => Manager::from_config(config, NoTls, manager_config),
            Tls::Rustls(tls) => {
                let connector = MakeRustlsConnect::new(tls.as_ref().clone());
                Manager::from_config(config, connector, manager_config)
            }
        };
        Pool::builder(manager)
            .max_size(max_size)
            .wait_timeout(wait)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| Error::Protocol(format!("pool: {}", e)))
    }
}

/// A connection from a pool; a pool error (timeout, closed) or a failed connect as an
/// `Error` (a connect failure stays a database error, so `is_database_fault` sees it).
pub(crate) async fn pooled(pool: &Pool) -> Result<deadpool_postgres::Object, Error> {
    use deadpool_postgres::PoolError;
    match pool.get().await {
        Ok(object) => Ok(object),
        Err(PoolError::Backend(error)) => Err(Error::Db(error)),
        Err(other) => Err(Error::Pool(other.to_string())),
    }
}
