//! The same manual API on the deployments users grow into: Redis Cluster, Redlock over
//! independent masters, TLS, and an ACL user.

mod deployments {
    mod acl;
    mod cluster;
    mod redlock;
    mod tls;
}
