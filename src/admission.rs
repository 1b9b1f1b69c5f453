//! The admission watermark (vLLM's `watermark`): blocks an allocation leaves free when it
//! admits a waiting or preempted request while other requests are scheduled this step.

use crate::error::{KvError, Result};

/// A request's scheduling status, as far as admission tells them apart (vLLM's
/// `RequestStatus`: `WAITING`, `PREEMPTED`, and every other status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    /// Waiting for its first admission.
    Waiting,
    /// Preempted, waiting to be admitted again.
    Preempted,
    /// Running, finished, or waiting on something other than blocks.
    Other,
}

impl RequestStatus {
    /// Whether a request in this status is awaiting admission, and so keeps the
    /// watermark free.
    #[inline]
    pub fn awaiting_admission(self) -> bool {
        matches!(self, Self::Waiting | Self::Preempted)
    }
}

/// The watermark in blocks: `int(watermark * num_blocks)`, as vLLM's manager computes it.
///
/// # Errors
///
/// [`KvError::InvalidArgument`] unless `watermark` is a finite number `>= 0`.
pub fn watermark_blocks(watermark: f64, num_blocks: usize) -> Result<usize> {
    if !(watermark >= 0.0 && watermark.is_finite()) {
        return Err(KvError::InvalidArgument(format!(
            "watermark must be a finite number >= 0, got {watermark}"
        )));
    }
    Ok((watermark * num_blocks as f64) as usize)
}

/// Whether an allocation's watermark depends on the request's status: only when others
/// are scheduled and the watermark is not 0. Otherwise the status need not be read.
#[inline]
pub fn status_matters(watermark_blocks: usize, has_scheduled_reqs: bool) -> bool {
    has_scheduled_reqs && watermark_blocks > 0
}

/// The blocks this allocation must leave free: the watermark for a request awaiting
/// admission while others are scheduled, else none.
#[inline]
pub fn blocks_kept_free(
    watermark_blocks: usize,
    has_scheduled_reqs: bool,
    awaiting_admission: bool,
) -> usize {
    if status_matters(watermark_blocks, has_scheduled_reqs) && awaiting_admission {
        watermark_blocks
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermark_is_a_fraction_of_the_pool_rounded_down() {
        assert_eq!(watermark_blocks(0.0, 100).unwrap(), 0);
        assert_eq!(watermark_blocks(0.01, 150).unwrap(), 1);
        assert_eq!(watermark_blocks(0.5, 11).unwrap(), 5);
        for bad in [-0.1, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                watermark_blocks(bad, 10),
                Err(KvError::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn only_requests_awaiting_admission_keep_it_free() {
        let statuses = [
            RequestStatus::Waiting,
            RequestStatus::Preempted,
            RequestStatus::Other,
        ];
        for status in statuses {
            let awaiting = status.awaiting_admission();
            assert_eq!(awaiting, status != RequestStatus::Other);
            assert_eq!(
                blocks_kept_free(5, true, awaiting),
                if awaiting { 5 } else { 0 }
            );
            assert_eq!(blocks_kept_free(5, false, awaiting), 0);
            assert_eq!(blocks_kept_free(0, true, awaiting), 0);
        }
    }
}
