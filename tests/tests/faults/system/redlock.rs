//! Redlock over N independent masters, each behind its own fault proxy, each keeping its data
//! across a kill unless the fault says otherwise.

use super::{total_counts, LockSystem, Node, NodeFault};

pub struct Redlock {
    nodes: Vec<Node>,
    name: &'static str,
}

impl Redlock {
    pub fn start(masters: usize) -> Self {
        let name = match masters {
            3 => "redlock over 3 masters",
            5 => "redlock over 5 masters",
            _ => panic!("the workload runs Redlock over 3 or 5 masters"),
        };
        Self {
            nodes: (0..masters).map(|_| Node::start_persistent()).collect(),
            name,
        }
    }
}

impl LockSystem for Redlock {
    fn name(&self) -> &'static str {
        self.name
    }

    fn worker_args(&self) -> Vec<String> {
        let urls: Vec<String> = self.nodes.iter().map(|n| n.proxy.url()).collect();
        vec![
            "--backend".into(),
            "redlock".into(),
            "--lock-url".into(),
            urls.join(","),
        ]
    }

    fn observed(&self) -> Vec<Vec<u16>> {
        self.nodes.iter().map(|n| vec![n.server.port()]).collect()
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    fn fencing(&self) -> bool {
        false
    }

    fn inject(&mut self, node: usize, fault: NodeFault) {
        self.nodes[node].inject(fault);
    }

    fn heal(&mut self, node: usize, fault: NodeFault) {
        self.nodes[node].heal(fault);
    }

    fn proxy_counts(&self) -> (u64, u64) {
        total_counts(self.nodes.iter())
    }
}
