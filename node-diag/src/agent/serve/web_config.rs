//! The web config file (`--web-config-file`), in Prometheus exporter-toolkit's format:
//! TLS (certificate, key, client CA and client-auth type, protocol versions), basic-auth
//! users with bcrypt hashes, and extra response headers.
//!
//! [`load`] reads the file and every file it names into an [`Active`] config: a rustls
//! server config and the users. [`Watch`] re-reads them when any of them changes; a bad
//! new config is logged and the one in force kept.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use axum::http::{HeaderName, HeaderValue};
use rustls::{
    DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme,
    SupportedProtocolVersion,
    client::danger::HandshakeSignatureValid,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, UnixTime, pem::PemObject},
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
};
use serde::Deserialize;

use super::basic_auth::BasicAuth;

/// A web config that cannot be used, with the file it came from.
#[derive(Debug, thiserror::Error)]
#[error("web config {}: {problem}", .path.display())]
pub(crate) struct WebConfigError {
    pub(crate) path: PathBuf,
    pub(crate) problem: Problem,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Problem {
    #[error("cannot read it: {0}")]
    Read(std::io::Error),
    #[error("not a valid web config: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("tls_server_config needs both cert_file and key_file")]
    CertAndKey,
    #[error(
        "tls_server_config.{0} (inline PEM) is not supported: put it in a file and use {0}_file"
    )]
    Inline(&'static str),
    #[error("cannot read {what} {}: {source}", .file.display())]
    Pem {
        what: &'static str,
        file: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("no certificate in {} (PEM expected)", .0.display())]
    NoCertificate(PathBuf),
    #[error(
        "unknown client_auth_type {0:?}: expected NoClientCert, RequestClientCert, RequireAnyClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert"
    )]
    ClientAuthType(String),
    #[error("client_auth_type {0} verifies client certificates against client_ca_file: set it")]
    NeedsClientCa(ClientAuth),
    #[error(
        "client_ca_file is set but client_auth_type is {0}, which ignores it: set client_auth_type: RequireAndVerifyClientCert"
    )]
    UnusedClientCa(ClientAuth),
    #[error(
        "client_allowed_sans is not supported: remove it, or sign client certificates with a CA of their own"
    )]
    AllowedSans,
    #[error("unknown TLS version {0:?}: expected TLS12 or TLS13")]
    TlsVersion(String),
    #[error("min_version {min} is above max_version {max}")]
    TlsVersions { min: String, max: String },
    #[error("basic_auth_users.{0}: not a bcrypt hash ($2y$..., e.g. from `htpasswd -nBC 10 USER`)")]
    NotBcrypt(String),
    #[error("basic_auth_users: a user name cannot contain ':' ({0:?})")]
    UserName(String),
    #[error("http_server_config.headers.{0}: not a valid header name and value")]
    Header(String),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    ClientCa(#[from] rustls::server::VerifierBuilderError),
}

/// Go's `tls.ClientAuthType`, as exporter-toolkit names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientAuth {
    NoClientCert,
    RequestClientCert,
    RequireAnyClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    fn parse(s: &str) -> Result<Self, Problem> {
        Ok(match s {
            "" | "NoClientCert" => Self::NoClientCert,
            "RequestClientCert" => Self::RequestClientCert,
            "RequireAnyClientCert" => Self::RequireAnyClientCert,
            "VerifyClientCertIfGiven" => Self::VerifyClientCertIfGiven,
            "RequireAndVerifyClientCert" => Self::RequireAndVerifyClientCert,
            other => return Err(Problem::ClientAuthType(other.to_owned())),
        })
    }

    fn verifies(self) -> bool {
        matches!(
            self,
            Self::VerifyClientCertIfGiven | Self::RequireAndVerifyClientCert
        )
    }
}

impl fmt::Display for ClientAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[derive(Deserialize, Default)]
struct RawConfig {
    tls_server_config: Option<RawTls>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
    http_server_config: Option<RawHttp>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml_ng::Value>,
}

#[derive(Deserialize, Default)]
struct RawTls {
    cert_file: Option<String>,
    key_file: Option<String>,
    client_ca_file: Option<String>,
    #[serde(default)]
    client_auth_type: String,
    min_version: Option<String>,
    max_version: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    client_ca: Option<String>,
    client_allowed_sans: Option<serde_yaml_ng::Value>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml_ng::Value>,
}

#[derive(Deserialize, Default)]
struct RawHttp {
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(flatten)]
    other: BTreeMap<String, serde_yaml_ng::Value>,
}

/// A parsed web config, its file names resolved; nothing read beyond the file itself.
#[derive(Debug, Default)]
pub(crate) struct Spec {
    pub(crate) tls: Option<TlsSpec>,
    /// bcrypt hash by user.
    pub(crate) users: BTreeMap<String, String>,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    /// Keys accepted and ignored, to be logged.
    pub(crate) warnings: Vec<String>,
}

#[derive(Debug)]
pub(crate) struct TlsSpec {
    pub(crate) cert_file: PathBuf,
    pub(crate) key_file: PathBuf,
    pub(crate) client_ca_file: Option<PathBuf>,
    pub(crate) client_auth: ClientAuth,
    pub(crate) versions: Vec<&'static SupportedProtocolVersion>,
}

impl Spec {
    /// Parses `text`, resolving relative file names against `dir` (the config's
    /// directory).
    pub(crate) fn parse(text: &str, dir: &Path) -> Result<Self, Problem> {
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_yaml_ng::from_str(text)?
        };
        let mut spec = Spec::default();
        for key in raw.other.keys() {
            spec.warnings.push(format!("unknown key {key} ignored"));
        }
        if let Some(tls) = raw.tls_server_config {
            spec.tls = Some(TlsSpec::parse(tls, dir, &mut spec.warnings)?);
        }
        for (user, hash) in raw.basic_auth_users {
            if user.contains(':') {
                return Err(Problem::UserName(user));
            }
            if hash.parse::<bcrypt::HashParts>().is_err() {
                return Err(Problem::NotBcrypt(user));
            }
            spec.users.insert(user, hash);
        }
        if let Some(http) = raw.http_server_config {
            for key in http.other.keys() {
                spec.warnings.push(format!(
                    "http_server_config.{key} ignored (HTTP/1.1 only, no other setting)"
                ));
            }
            for (name, value) in http.headers {
                let parsed = (
                    HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(&value),
                );
                let (Ok(n), Ok(v)) = parsed else {
                    return Err(Problem::Header(name));
                };
                spec.headers.push((n, v));
            }
        }
        Ok(spec)
    }

    /// The files the config names (to watch for changes).
    pub(crate) fn files(&self) -> Vec<PathBuf> {
        let Some(tls) = &self.tls else {
            return Vec::new();
        };
        let mut files = vec![tls.cert_file.clone(), tls.key_file.clone()];
        files.extend(tls.client_ca_file.clone());
        files
    }
}

impl TlsSpec {
    fn parse(raw: RawTls, dir: &Path, warnings: &mut Vec<String>) -> Result<Self, Problem> {
        for (field, value) in [
            ("cert", &raw.cert),
            ("key", &raw.key),
            ("client_ca", &raw.client_ca),
        ] {
            if value.is_some() {
                return Err(Problem::Inline(field));
            }
        }
        if raw.client_allowed_sans.is_some() {
            return Err(Problem::AllowedSans);
        }
        for key in raw.other.keys() {
            warnings.push(format!(
                "tls_server_config.{key} ignored (rustls chooses cipher suites and curves)"
            ));
        }
        let resolve = |f: &str| dir.join(f);
        let (Some(cert), Some(key)) = (&raw.cert_file, &raw.key_file) else {
            return Err(Problem::CertAndKey);
        };
        let client_auth = ClientAuth::parse(&raw.client_auth_type)?;
        let client_ca_file = raw.client_ca_file.as_deref().map(resolve);
        match (&client_ca_file, client_auth) {
            (None, auth) if auth.verifies() => return Err(Problem::NeedsClientCa(auth)),
            (Some(_), auth) if !auth.verifies() => return Err(Problem::UnusedClientCa(auth)),
            _ => {}
        }
        if matches!(
            client_auth,
            ClientAuth::RequestClientCert | ClientAuth::RequireAnyClientCert
        ) {
            warnings.push(format!(
                "client_auth_type {client_auth} accepts any client certificate without verifying it: use RequireAndVerifyClientCert to authenticate clients"
            ));
        }
        let version = |v: &Option<String>, default: u8| match v.as_deref() {
            None | Some("") => Ok(default),
            Some("TLS12") => Ok(12),
            Some("TLS13") => Ok(13),
            Some(other) => Err(Problem::TlsVersion(other.to_owned())),
        };
        let (min, max) = (
            version(&raw.min_version, 12)?,
            version(&raw.max_version, 13)?,
        );
        if min > max {
            return Err(Problem::TlsVersions {
                min: raw.min_version.unwrap_or_default(),
                max: raw.max_version.unwrap_or_default(),
            });
        }
        let mut versions = Vec::new();
        if min <= 12 {
            versions.push(&rustls::version::TLS12);
        }
        if max >= 13 {
            versions.push(&rustls::version::TLS13);
        }
        Ok(Self {
            cert_file: resolve(cert),
            key_file: resolve(key),
            client_ca_file,
            client_auth,
            versions,
        })
    }

    /// The rustls server config: the certificate files read, the client verifier built.
    fn build(&self) -> Result<ServerConfig, Problem> {
        // ring, deprecated by rustls for lacking post-quantum key exchange: aws-lc-rs
        // needs cmake and a C cross toolchain per target, and a scrape needs no more.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = pem_certs("certificate", &self.cert_file)?;
        let key = PrivateKeyDer::from_pem_file(&self.key_file).map_err(|source| Problem::Pem {
            what: "private key",
            file: self.key_file.clone(),
            source,
        })?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&self.versions)?;
        let builder = match (self.client_auth, &self.client_ca_file) {
            (ClientAuth::NoClientCert, _) => builder.with_no_client_auth(),
            (ClientAuth::RequestClientCert, _) | (ClientAuth::RequireAnyClientCert, _) => builder
                .with_client_cert_verifier(Arc::new(AnyClientCert {
                    mandatory: self.client_auth == ClientAuth::RequireAnyClientCert,
                    provider: provider.clone(),
                })),
            (auth, Some(ca)) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in pem_certs("client CA", ca)? {
                    roots.add(cert)?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
                let verifier = if auth == ClientAuth::VerifyClientCertIfGiven {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                builder.with_client_cert_verifier(verifier.build()?)
            }
            (auth, None) => return Err(Problem::NeedsClientCa(auth)),
        };
        let mut config = builder.with_single_cert(certs, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

fn pem_certs(what: &'static str, file: &Path) -> Result<Vec<CertificateDer<'static>>, Problem> {
    let pem_err = |source| Problem::Pem {
        what,
        file: file.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(file)
        .map_err(pem_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err)?;
    if certs.is_empty() {
        return Err(Problem::NoCertificate(file.to_owned()));
    }
    Ok(certs)
}

/// `RequestClientCert` and `RequireAnyClientCert`: a certificate is asked for (and, for
/// the latter, required) and its handshake signature checked, but not its issuer, as Go
/// does.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The web config in force.
#[derive(Default)]
pub(crate) struct Active {
    pub(crate) tls: Option<Tls>,
    pub(crate) auth: Option<Arc<BasicAuth>>,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
}

pub(crate) struct Tls {
    pub(crate) config: Arc<ServerConfig>,
    pub(crate) client_auth: ClientAuth,
}

impl Active {
    /// Whether a connection set up under this config has a client certificate verified
    /// against the client CA: what serving `/findings` on the scrape listener takes.
    pub(crate) fn verifies_clients(&self) -> bool {
        self.tls
            .as_ref()
            .is_some_and(|t| t.client_auth == ClientAuth::RequireAndVerifyClientCert)
    }

    fn build(spec: &Spec) -> Result<Self, Problem> {
        let tls = match &spec.tls {
            Some(tls) => Some(Tls {
                config: Arc::new(tls.build()?),
                client_auth: tls.client_auth,
            }),
            None => None,
        };
        let auth = (!spec.users.is_empty()).then(|| Arc::new(BasicAuth::new(spec.users.clone())));
        Ok(Self {
            tls,
            auth,
            headers: spec.headers.clone(),
        })
    }
}

/// A loaded web config and what it was read from.
pub(crate) struct Loaded {
    pub(crate) active: Active,
    pub(crate) warnings: Vec<String>,
    stamp: Stamp,
}

/// What the files looked like when read: their modification times, sizes and inodes.
type Stamp = Vec<Option<(SystemTime, u64, u64)>>;

fn stamp(files: &[PathBuf]) -> Stamp {
    use std::os::unix::fs::MetadataExt as _;
    files
        .iter()
        .map(|f| {
            std::fs::metadata(f).ok().map(|m| {
                (
                    m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    m.len(),
                    m.ino(),
                )
            })
        })
        .collect()
}

/// Reads the config at `path` and every file it names.
pub(crate) fn load(path: &Path) -> Result<Loaded, WebConfigError> {
    let err = |problem| WebConfigError {
        path: path.to_owned(),
        problem,
    };
    // Stamped before reading: a change while reading is seen at the next poll.
    let before = stamp(&[path.to_owned()]);
    let text = std::fs::read_to_string(path).map_err(|e| err(Problem::Read(e)))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let spec = Spec::parse(&text, dir).map_err(err)?;
    let mut stamp_all = before;
    stamp_all.extend(stamp(&spec.files()));
    let active = Active::build(&spec).map_err(err)?;
    Ok(Loaded {
        active,
        warnings: spec.warnings,
        stamp: stamp_all,
    })
}

/// Polls the config and the files it names; reloads when any of them changed.
pub(crate) struct Watch {
    path: PathBuf,
    files: Vec<PathBuf>,
    /// The stamp of the config in force, or of the last one that failed (so that a bad
    /// config is reported once, not at every poll).
    seen: Stamp,
}

impl Watch {
    pub(crate) fn new(path: &Path, loaded: &Loaded) -> Self {
        let mut files = vec![path.to_owned()];
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(spec) = Spec::parse(&text, path.parent().unwrap_or(Path::new(".")))
        {
            files.extend(spec.files());
        }
        Self {
            path: path.to_owned(),
            files,
            seen: loaded.stamp.clone(),
        }
    }

    /// A new config when the files changed since the last poll: `Ok` to put in force,
    /// `Err` to report (the one in force stays).
    pub(crate) fn poll(&mut self) -> Option<Result<Loaded, WebConfigError>> {
        let now = stamp(&self.files);
        if now == self.seen {
            return None;
        }
        let result = load(&self.path);
        match &result {
            Ok(loaded) => {
                self.files = vec![self.path.clone()];
                if let Ok(text) = std::fs::read_to_string(&self.path)
                    && let Ok(spec) =
                        Spec::parse(&text, self.path.parent().unwrap_or(Path::new(".")))
                {
                    self.files.extend(spec.files());
                }
                self.seen = loaded.stamp.clone();
            }
            Err(_) => self.seen = now,
        }
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Spec, Problem> {
        Spec::parse(text, Path::new("/etc/node-diag"))
    }

    /// A bcrypt hash of `secret` at the lowest cost (fast in tests).
    fn hash(password: &str) -> String {
        bcrypt::hash(password, 4).unwrap()
    }

    #[test]
    fn an_empty_config_is_plain_http_without_auth() {
        let spec = parse("").unwrap();
        assert!(spec.tls.is_none() && spec.users.is_empty() && spec.warnings.is_empty());
        let spec = parse("{}\n").unwrap();
        assert!(spec.tls.is_none());
    }

    #[test]
    fn each_client_auth_type_parses() {
        for (name, auth, ca) in [
            ("NoClientCert", ClientAuth::NoClientCert, false),
            ("RequestClientCert", ClientAuth::RequestClientCert, false),
            (
                "RequireAnyClientCert",
                ClientAuth::RequireAnyClientCert,
                false,
            ),
            (
                "VerifyClientCertIfGiven",
                ClientAuth::VerifyClientCertIfGiven,
                true,
            ),
            (
                "RequireAndVerifyClientCert",
                ClientAuth::RequireAndVerifyClientCert,
                true,
            ),
        ] {
            let ca_line = if ca { "  client_ca_file: ca.crt\n" } else { "" };
            let text = format!(
                "tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n  client_auth_type: {name}\n{ca_line}"
            );
            let spec = parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            let tls = spec.tls.unwrap();
            assert_eq!(tls.client_auth, auth, "{name}");
            assert_eq!(tls.client_ca_file.is_some(), ca, "{name}");
        }
        // The default, as exporter-toolkit's.
        let spec = parse("tls_server_config:\n  cert_file: s.crt\n  key_file: s.key\n").unwrap();
        assert_eq!(spec.tls.unwrap().client_auth, ClientAuth::NoClientCert);
    }

    #[test]
    fn relative_files_resolve_against_the_config_directory() {
        let spec = parse(
            "tls_server_config:\n  cert_file: tls/s.crt\n  key_file: /abs/s.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n",
        )
        .unwrap();
        let tls = spec.tls.unwrap();
        assert_eq!(tls.cert_file, Path::new("/etc/node-diag/tls/s.crt"));
        assert_eq!(tls.key_file, Path::new("/abs/s.key"));
        assert_eq!(
            tls.client_ca_file.as_deref(),
            Some(Path::new("/etc/node-diag/ca.crt"))
        );
    }

    #[test]
    fn invalid_configs_say_what_is_wrong() {
        let cases: &[(&str, &str)] = &[
            ("tls_server_config: [", "not a valid web config"),
            (
                "tls_server_config:\n  cert_file: s.crt\n",
                "cert_file and key_file",
            ),
            (
                "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Always\n",
                "unknown client_auth_type \"Always\"",
            ),
            (
                "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
                "client_ca_file",
            ),
            (
                "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_ca_file: ca\n",
                "set client_auth_type",
            ),
            (
                "tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS10\n",
                "unknown TLS version",
            ),
            (
                "tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS13\n  max_version: TLS12\n",
                "above max_version",
            ),
            (
                "tls_server_config:\n  cert: PEM\n  key_file: b\n",
                "inline PEM",
            ),
            (
                "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_allowed_sans: [x]\n",
                "client_allowed_sans",
            ),
            (
                "basic_auth_users:\n  alice: plaintext\n",
                "not a bcrypt hash",
            ),
            (
                "http_server_config:\n  headers:\n    \"bad name\": x\n",
                "not a valid header",
            ),
        ];
        for (text, says) in cases {
            let err = parse(text)
                .err()
                .unwrap_or_else(|| panic!("accepted: {text}"));
            assert!(err.to_string().contains(says), "{text:?}: {err}");
        }
    }

    #[test]
    fn unknown_keys_are_ignored_with_a_warning() {
        let spec = parse(
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\nhttp_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\nsomething_else: 1\n",
        )
        .unwrap();
        assert_eq!(spec.warnings.len(), 3, "{:?}", spec.warnings);
        assert_eq!(spec.headers.len(), 1);
    }

    #[test]
    fn tls_versions_follow_min_and_max() {
        use rustls::ProtocolVersion::{TLSv1_2, TLSv1_3};
        let versions = |extra: &str| {
            let text = format!("tls_server_config:\n  cert_file: a\n  key_file: b\n{extra}");
            let tls = parse(&text).unwrap().tls.unwrap();
            tls.versions.iter().map(|v| v.version).collect::<Vec<_>>()
        };
        assert_eq!(versions(""), vec![TLSv1_2, TLSv1_3]);
        assert_eq!(versions("  min_version: TLS13\n"), vec![TLSv1_3]);
        assert_eq!(versions("  max_version: TLS12\n"), vec![TLSv1_2]);
    }

    #[test]
    fn bcrypt_users_are_checked() {
        let spec = parse(&format!(
            "basic_auth_users:\n  alice: {}\n  bob: '{}'\n",
            hash("wonderland"),
            // htpasswd's prefix.
            hash("builder").replacen("$2b$", "$2y$", 1)
        ))
        .unwrap();
        let auth = BasicAuth::new(spec.users);
        assert!(auth.verify("alice", "wonderland"));
        assert!(!auth.verify("alice", "wrong"));
        assert!(auth.verify("bob", "builder"));
        assert!(!auth.verify("carol", "wonderland"));
    }

    #[test]
    fn a_missing_file_names_the_file() {
        let err = load(Path::new("/nonexistent/web.yml")).err().unwrap();
        let text = err.to_string();
        assert!(
            text.contains("/nonexistent/web.yml") && text.contains("cannot read"),
            "{text}"
        );
    }
}
