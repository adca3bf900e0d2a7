//! The guide: how the library works inside, every deployment mode in detail, what it
//! measures, and what it shows in traces. Each chapter is a page of its own and defines
//! nothing; the markdown lives in `src/docs/`, where it also reads as plain files.

pub mod how_it_works {
    #![doc = include_str!("docs/how_it_works.md")]
}

pub mod deployments {
    #![doc = include_str!("docs/deployments.md")]
}

pub mod metrics {
    #![doc = include_str!("docs/metrics.md")]
}

pub mod tracing {
    #![doc = include_str!("docs/tracing.md")]
}
