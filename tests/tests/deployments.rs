//! The same manual API on the deployments users grow into: Redis Cluster, Redlock over
//! independent masters, Redis Sentinel, one server whose writes replicas confirm, TLS, and an
//! ACL user.

mod deployments {
    mod acl;
    mod cluster;
    mod redlock;
    mod replicas;
    mod sentinel;
    mod tls;
}
