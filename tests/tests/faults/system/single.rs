//! One redis-server behind one fault proxy.

use super::{LockSystem, Node, NodeFault};

pub struct SingleNode {
    node: Node,
}

impl SingleNode {
    pub fn start() -> Self {
        Self {
            node: Node::start_persistent(),
        }
    }
}

impl LockSystem for SingleNode {
    fn name(&self) -> &'static str {
        "single node"
    }

    fn worker_args(&self) -> Vec<String> {
        vec![
            "--backend".into(),
            "single".into(),
            "--lock-url".into(),
            self.node.proxy.url(),
        ]
    }

    fn observed(&self) -> Vec<Vec<u16>> {
        vec![vec![self.node.server.port()]]
    }

    fn quorum(&self) -> usize {
        1
    }

    fn inject(&mut self, node: usize, fault: NodeFault) {
        assert_eq!(node, 0, "a single node");
        self.node.inject(fault);
    }

    fn heal(&mut self, node: usize, fault: NodeFault) {
        assert_eq!(node, 0, "a single node");
        self.node.heal(fault);
    }

    fn proxy_counts(&self) -> (u64, u64) {
        self.node.proxy_counts()
    }
}
