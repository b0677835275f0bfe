//! A throw-away PKI made by `openssl`: a CA, a server certificate for given addresses
//! and names, a client certificate, for tests of the agent's TLS listeners and of the
//! client's TLS flags.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use crate::unique_name;

/// A temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{}-{what}", unique_name()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("cannot create a temporary directory");
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Runs `openssl args...`; panics with its output unless it succeeds.
pub fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().expect(
        "cannot run openssl (apt-get install openssl, or `cargo xtask prereqs --test-tools`)",
    );
    assert!(
        out.status.success(),
        "openssl {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`NAME-ca.crt`), and certificates it signed: a server one (`server.crt`,
/// `server.key`) for the names in `server_names` (IP addresses, or DNS names) when
/// given, and a client one (`NAME.crt`, `NAME.key`).
pub fn make_pki(dir: &TempDir, name: &str, server_names: Option<&[&str]>) {
    let ca_key = dir.arg(&format!("{name}-ca.key"));
    let ca_crt = dir.arg(&format!("{name}-ca.crt"));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        &ca_key,
        "-out",
        &ca_crt,
        "-days",
        "2",
        "-subj",
        &format!("/CN={name} CA"),
    ]);
    let sign = |leaf: &str, ext: String| {
        let key = dir.arg(&format!("{leaf}.key"));
        let csr = dir.arg(&format!("{leaf}.csr"));
        let crt = dir.arg(&format!("{leaf}.crt"));
        let ext_file = dir.arg(&format!("{leaf}.ext"));
        fs::write(&ext_file, ext).expect("write extensions");
        openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={leaf}"),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext_file,
        ]);
    };
    if let Some(names) = server_names {
        let sans: Vec<String> = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(_) => format!("IP:{n}"),
                Err(_) => format!("DNS:{n}"),
            })
            .collect();
        sign(
            "server",
            format!(
                "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName={}\n",
                sans.join(",")
            ),
        );
    }
    sign(
        name,
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n".to_owned(),
    );
}
