//! First-start credentials: a CA, a serving certificate, an admin token and a kubeconfig,
//! all kept in the data directory.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// Errors setting up credentials.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// Reading or writing a file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// Generating a key or certificate.
    #[error("generating certificates: {0}")]
    Certificate(#[from] rcgen::Error),
    /// Building the TLS configuration.
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// What the server needs to serve TLS and authenticate its admin.
pub struct Credentials {
    /// The rustls server configuration.
    pub tls: Arc<rustls::ServerConfig>,
    /// The admin bearer token.
    pub token: String,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// Where the kubeconfig was written.
    pub kubeconfig: PathBuf,
}

fn read(path: &Path) -> Result<Option<String>, PkiError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PkiError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes a file atomically and durably: a temporary file created with its final mode (0600
/// for secrets, so no moment exists where another user could read them), fsynced, renamed over
/// the target, and the directory fsynced so the rename itself survives a crash.
fn write(path: &Path, contents: &str, private: bool) -> Result<(), PkiError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| PkiError::Io {
        path: path.to_path_buf(),
        source,
    };
    let temporary = path.with_extension("tmp");
    match std::fs::remove_file(&temporary) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(e)),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(&temporary)
        .map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(io)?;
    if let Some(parent) = path.parent() {
        std::fs::File::open(parent)
            .and_then(|dir| dir.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

/// Creates `dir` (and missing parents) readable by its owner only, and tightens an existing
/// one to 0700: it holds the CA key, the admin token and the store.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Tightens an existing secret written by an older Capstan to 0600.
fn tighten(path: &Path) -> Result<(), PkiError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(PkiError::Io {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "capstan-ca");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// Loads (or creates on first start) the CA, token and serving certificate in `dir`, and
/// writes `dir/kubeconfig` pointing at `server` (`https://host:port`).
pub fn ensure(dir: &Path, bind: IpAddr, server: &str) -> Result<Credentials, PkiError> {
    private_dir(dir).map_err(|source| PkiError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let ca_key_path = dir.join("ca.key");
    let ca_cert_path = dir.join("ca.crt");
    let token_path = dir.join("admin.token");
    for secret in [&ca_key_path, &token_path] {
        tighten(secret)?;
    }
    let (ca_key, ca_pem) = match (read(&ca_key_path)?, read(&ca_cert_path)?) {
        (Some(key), Some(cert)) => (KeyPair::from_pem(&key)?, cert),
        _ => {
            let key = KeyPair::generate()?;
            let cert = ca_params()?.self_signed(&key)?;
            write(&ca_key_path, &key.serialize_pem(), true)?;
            write(&ca_cert_path, &cert.pem(), false)?;
            (key, cert.pem())
        }
    };
    let token = match read(&token_path)? {
        Some(token) if !token.trim().is_empty() => token.trim().to_string(),
        _ => {
            let token = format!(
                "{}{}",
                uuid::Uuid::new_v4().simple(),
                uuid::Uuid::new_v4().simple()
            );
            write(&token_path, &token, true)?;
            token
        }
    };
    // The serving certificate is re-issued on every start so it always names the current
    // bind address.
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if !bind.is_unspecified() {
        names.push(bind.to_string());
    }
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "capstan-apiserver");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let serving_key = KeyPair::generate()?;
    let issuer = Issuer::new(ca_params()?, ca_key);
    let serving = params.signed_by(&serving_key, &issuer)?;
    let ca_der = rustls::pki_types::CertificateDer::from(
        rustls::pki_types::pem::PemObject::from_pem_slice(ca_pem.as_bytes())
            .map(|c: rustls::pki_types::CertificateDer<'static>| c.to_vec())
            .unwrap_or_default(),
    );
    let chain = vec![serving.der().clone(), ca_der];
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(serving_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let kubeconfig = dir.join("kubeconfig");
    let ca_data = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "capstan", "cluster": {
            "server": server,
            "certificate-authority-data": ca_data,
        }}],
        "contexts": [{"name": "capstan", "context": {
            "cluster": "capstan",
            "user": "admin",
            "namespace": "default",
        }}],
        "current-context": "capstan",
        "users": [{"name": "admin", "user": {"token": token}}],
    });
    let text = capstan_machinery::yaml::to_string(&config).map_err(|e| PkiError::Io {
        path: kubeconfig.clone(),
        source: std::io::Error::other(e),
    })?;
    write(&kubeconfig, &text, true)?;
    Ok(Credentials {
        tls: Arc::new(tls),
        token,
        ca_pem,
        kubeconfig,
    })
}
