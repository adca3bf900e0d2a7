//! The same manual API on the deployments users grow into: Redis Cluster, Redlock over
//! independent masters, Redis Sentinel, TLS, and an ACL user.

mod deployments {
    mod acl;
    mod cluster;
    mod redlock;
    mod sentinel;
    mod tls;
}
