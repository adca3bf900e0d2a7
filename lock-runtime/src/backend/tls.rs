//! The certificates a registry's TLS connections trust and present (the `tls` feature), given
//! once to the builder whatever the store, and turned by each store into its own client's
//! configuration (`redis::config`, `postgres::tls`).

/// A private CA to trust instead of the system's roots, and a client certificate for mutual
/// TLS, as PEM.
#[derive(Default, Clone)]
pub(crate) struct Tls {
    #[cfg(feature = "tls")]
    pub(crate) root_cert: Option<Vec<u8>>,
    #[cfg(feature = "tls")]
    pub(crate) client_cert: Option<ClientCert>,
}

/// A client certificate and its key (PEM).
#[cfg(feature = "tls")]
#[derive(Clone)]
pub(crate) struct ClientCert {
    pub(crate) cert_pem: Vec<u8>,
    pub(crate) key_pem: Vec<u8>,
}

/// Says whether certificates were given, never their bytes (a client key is a secret).
impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("certificates", &self.given())
            .finish()
    }
}

impl Tls {
    #[cfg(feature = "tls")]
    pub(crate) fn root_cert(&mut self, pem: Vec<u8>) {
        self.root_cert = Some(pem);
    }

    #[cfg(feature = "tls")]
    pub(crate) fn client_cert(&mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>) {
        self.client_cert = Some(ClientCert { cert_pem, key_pem });
    }

    /// Whether any certificate was given.
    pub(crate) fn given(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.root_cert.is_some() || self.client_cert.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }
}
