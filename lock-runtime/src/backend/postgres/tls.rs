//! TLS to Postgres (the `postgres-tls` feature). A connection string with `sslmode=require`
//! (or libpq's `verify-full` or `verify-ca`, read as it) speaks TLS through rustls, which always
//! checks the server's certificate, against the registry's CA
//! ([`tls_root_cert`](crate::RegistryBuilder::tls_root_cert)) or else the system's roots, and
//! its host name, as libpq's `verify-full` does; a client certificate
//! ([`tls_client_cert`](crate::RegistryBuilder::tls_client_cert)) is presented when given.
//! Any other `sslmode` (and none) connects in plain TCP: never TLS with an unchecked
//! certificate, which is what libpq's default `prefer` would try.

use tokio_postgres::config::SslMode;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config, Connection, Socket};

use crate::backend::tls::Tls;
use crate::error::LockError;

/// What makes the store's connections: rustls where the feature is on (plain TCP still where
/// the connection string does not ask for TLS), plain TCP otherwise.
#[cfg(feature = "postgres-tls")]
pub(super) type Connector = tokio_postgres_rustls::MakeRustlsConnect;
#[cfg(not(feature = "postgres-tls"))]
pub(super) type Connector = tokio_postgres::NoTls;

/// A database to connect to: its configuration, and the connector its TLS mode needs.
#[derive(Clone)]
pub(super) struct Endpoint {
    pub(super) config: Config,
    connector: Connector,
}

/// [`Endpoint::connect`]'s future.
pub(super) type Connecting<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Made, tokio_postgres::Error>> + Send + 'a>,
>;

/// A connection as [`Endpoint::connect`] makes it; its driver must be polled.
pub(super) type Made = (
    Client,
    Connection<Socket, <Connector as MakeTlsConnect<Socket>>::Stream>,
);

impl Endpoint {
    /// `config` with the connector its `sslmode` asks for (see [`connector`]).
    pub(super) fn new(mut config: Config, tls: &Tls) -> Result<Self, LockError> {
        let connector = connector(&mut config, tls)?;
        Ok(Self { config, connector })
    }

    /// Boxed: a TLS handshake's future is deep, and every caller's future (an attributed fn's
    /// among them) would otherwise carry its layout, past the compiler's recursion limit.
    #[allow(
        clippy::clone_on_copy,
        reason = "plain TCP's connector is Copy, rustls' is not"
    )]
    pub(super) fn connect(&self) -> Connecting<'_> {
        Box::pin(self.config.connect(self.connector.clone()))
    }
}

/// libpq's modes that check the server's certificate, which tokio-postgres does not parse,
/// written as `require` (which checks it here): `sslmode=verify-full` is what a managed
/// database's instructions say. Only the value of an `sslmode` parameter, as tokio-postgres
/// reads the string, is rewritten: never a password or other value that happens to spell it.
pub(crate) fn readable(url: &str) -> String {
    let mut url = url.to_owned();
    for (start, end) in sslmode_values(&url).into_iter().rev() {
        let value = &url[start..end];
        if ["verify-full", "verify-ca", "'verify-full'", "'verify-ca'"].contains(&value) {
            url.replace_range(start..end, "require");
        }
    }
    url
}

/// Where each `sslmode` parameter's value is in `url` (quotes included), in order, as
/// tokio-postgres splits a URL (`?key=value&..` after the login, which ends at the first `@`)
/// or libpq's `key = value` pairs (a value quoted or not, with `\` escapes). What it would
/// refuse is left for it to say.
fn sslmode_values(url: &str) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let prefix = ["postgres://", "postgresql://"]
        .into_iter()
        .find(|p| url.starts_with(p));
    if let Some(prefix) = prefix {
        let login = url[prefix.len()..].find('@').map_or(0, |at| at + 1);
        let Some(query) = url[prefix.len() + login..].find('?') else {
            return found;
        };
        let mut at = prefix.len() + login + query + 1;
        while let Some(eq) = url[at..].find('=') {
            let (key, value) = (&url[at..at + eq], at + eq + 1);
            let end = url[value..].find('&').map_or(url.len(), |amp| value + amp);
            if key == "sslmode" {
                found.push((value, end));
            }
            at = (end + 1).min(url.len());
        }
        return found;
    }
    let mut chars = url.char_indices().peekable();
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_ws(&mut chars);
        let Some(&(key, _)) = chars.peek() else {
            return found;
        };
        while chars
            .next_if(|(_, c)| !c.is_whitespace() && *c != '=')
            .is_some()
        {}
        let key = &url[key..chars.peek().map_or(url.len(), |&(i, _)| i)];
        skip_ws(&mut chars);
        if key.is_empty() || chars.next_if(|&(_, c)| c == '=').is_none() {
            return found;
        }
        skip_ws(&mut chars);
        let start = chars.peek().map_or(url.len(), |&(i, _)| i);
        let quoted = chars.next_if(|&(_, c)| c == '\'').is_some();
        loop {
            match chars.peek() {
                None if quoted => return found,
                None => break,
                Some(&(_, c)) if c.is_whitespace() && !quoted => break,
                Some(&(_, '\'')) if quoted => {
                    chars.next();
                    break;
                }
                Some(&(_, c)) => {
                    chars.next();
                    if c == '\\' {
                        chars.next();
                    }
                }
            }
        }
        let end = chars.peek().map_or(url.len(), |&(i, _)| i);
        if key == "sslmode" {
            found.push((start, end));
        }
    }
}

/// The connector for `config`, whose TLS mode it settles: `require` keeps TLS, anything else
/// becomes plain TCP.
fn connector(config: &mut Config, tls: &Tls) -> Result<Connector, LockError> {
    let wanted = config.get_ssl_mode() == SslMode::Require;
    if !wanted {
        config.ssl_mode(SslMode::Disable);
    }
    #[cfg(feature = "postgres-tls")]
    return rustls(tls, wanted).map(tokio_postgres_rustls::MakeRustlsConnect::new);
    #[cfg(not(feature = "postgres-tls"))]
    {
        let _ = tls;
        if wanted {
            return Err(LockError::config(
                "the Postgres connection string asks for TLS (sslmode=require), but lock-runtime \
                 was built without its `postgres-tls` feature; enable it (lock-runtime = { .., \
                 features = [\"postgres-tls\"] }) or connect without sslmode",
            ));
        }
        Ok(tokio_postgres::NoTls)
    }
}

/// rustls' client configuration: the registry's CA or the system's roots (none where TLS is
/// not `wanted`: the connector is then never used), and its client certificate.
#[cfg(feature = "postgres-tls")]
fn rustls(tls: &Tls, wanted: bool) -> Result<rustls::ClientConfig, LockError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let bad = |what: &str, e: &dyn std::fmt::Display| {
        LockError::config(format!(
            "the TLS {what} for Postgres could not be used ({e}); give PEM-encoded \
             certificates and key (tls_root_cert, tls_client_cert)"
        ))
    };
    let mut roots = rustls::RootCertStore::empty();
    match (&tls.root_cert, wanted) {
        (_, false) => {}
        (Some(pem), true) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| bad("root certificate", &e))?;
                roots.add(cert).map_err(|e| bad("root certificate", &e))?;
            }
            if roots.is_empty() {
                return Err(bad("root certificate", &"no certificate in the PEM"));
            }
        }
        (None, true) => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(LockError::config(format!(
                    "Postgres over TLS needs a CA to check the server's certificate, and none \
                     of the system's roots could be read ({:?}); give one with \
                     RegistryBuilder::tls_root_cert, or point SSL_CERT_FILE at its PEM",
                    found.errors.first()
                )));
            }
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("configuration", &e))?
        .with_root_certificates(roots);
    match &tls.client_cert {
        Some(client) if wanted => {
            let certs = CertificateDer::pem_slice_iter(&client.cert_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad("client certificate", &e))?;
            if certs.is_empty() {
                return Err(bad("client certificate", &"no certificate in the PEM"));
            }
            let key = PrivateKeyDer::from_pem_slice(&client.key_pem)
                .map_err(|e| bad("client key", &e))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| bad("client certificate", &e))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_modes_that_check_the_server_read_as_require() {
        assert_eq!(
            readable("postgres://db/app?sslmode=verify-full"),
            "postgres://db/app?sslmode=require"
        );
        assert_eq!(
            readable("host=db sslmode=verify-ca"),
            "host=db sslmode=require"
        );
        assert_eq!(readable("host=db"), "host=db");
    }

    /// The `sslmode` a connection string means, and its password, as tokio-postgres reads
    /// [`readable`]'s rewrite of it.
    fn read(url: &str) -> (SslMode, Option<Vec<u8>>) {
        let config: Config = readable(url)
            .parse()
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        (
            config.get_ssl_mode(),
            config.get_password().map(<[u8]>::to_vec),
        )
    }

    #[test]
    fn only_the_sslmode_parameter_is_rewritten_never_a_password_that_spells_it() {
        let pw = |s: &str| Some(s.as_bytes().to_vec());
        assert_eq!(
            read("postgres://u:x-sslmode=verify-full@db/app?sslmode=verify-full"),
            (SslMode::Require, pw("x-sslmode=verify-full"))
        );
        assert_eq!(
            read("postgres://u:x-sslmode=verify-ca@db/app"),
            (SslMode::Prefer, pw("x-sslmode=verify-ca"))
        );
        assert_eq!(
            read("postgresql://db/app?application_name=a&sslmode=verify-ca&connect_timeout=5"),
            (SslMode::Require, None)
        );
        assert_eq!(
            read("host=db password='a sslmode=verify-full' sslmode=verify-ca"),
            (SslMode::Require, pw("a sslmode=verify-full"))
        );
        assert_eq!(
            read(r"host=db password=x\ sslmode=verify-full"),
            (SslMode::Prefer, pw("x sslmode=verify-full"))
        );
        // libpq's other spellings of the parameter: spaces around `=`, a quoted value.
        assert_eq!(
            read("host=db sslmode = 'verify-full' password=p"),
            (SslMode::Require, pw("p"))
        );
        assert_eq!(read("sslmode =verify-ca host=db"), (SslMode::Require, None));
        // Whatever tokio-postgres refuses, it still refuses (and says which parameter).
        assert!(readable("host=db sslmode=verify-fuller")
            .parse::<Config>()
            .is_err());
        assert!(readable("host=db password='open")
            .parse::<Config>()
            .is_err());
    }

    /// PEM that holds no certificate, or is not PEM at all, is refused at `build` with what
    /// was wrong and which option gave it: no panic, no connection attempt.
    #[cfg(feature = "postgres-tls")]
    #[test]
    fn bad_pem_is_refused_with_the_option_that_gave_it() {
        let refused = |tls: Tls| {
            let mut require: Config = "host=db sslmode=require".parse().unwrap();
            connector(&mut require, &tls).err().unwrap().to_string()
        };
        let key = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".to_vec();
        for pem in [b"not pem".to_vec(), Vec::new(), key.clone()] {
            let mut tls = Tls::default();
            tls.root_cert(pem.clone());
            let e = refused(tls);
            assert!(
                e.contains("root certificate") && e.contains("tls_root_cert"),
                "{e}"
            );
            let mut tls = Tls::default();
            tls.client_cert(pem, key.clone());
            let e = refused(tls);
            assert!(
                e.contains("client certificate") && e.contains("no certificate in the PEM"),
                "{e}"
            );
        }
        let mut tls = Tls::default();
        tls.root_cert(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec());
        let e = refused(tls);
        assert!(e.contains("root certificate"), "{e}");
    }

    #[test]
    fn tls_is_used_only_where_the_connection_string_requires_it() {
        let mut prefer: Config = "host=db".parse().unwrap();
        assert!(connector(&mut prefer, &Tls::default()).is_ok());
        assert_eq!(prefer.get_ssl_mode(), SslMode::Disable);
        let mut require: Config = "host=db sslmode=require".parse().unwrap();
        let made = connector(&mut require, &Tls::default());
        assert_eq!(require.get_ssl_mode(), SslMode::Require);
        #[cfg(not(feature = "postgres-tls"))]
        assert!(made
            .err()
            .unwrap()
            .to_string()
            .contains("`postgres-tls` feature"));
        #[cfg(feature = "postgres-tls")]
        let _ = made;
    }
}
