//! Rows of different lengths as one right-padded batch on the device: token ids, question types and
//! the flat positions the head reads out (each row's first token and its option markers).

use std::borrow::Borrow;

use candle_core::{Device, Tensor};
use layad_proto::Row;

/// Id written into padding; any id works, since padded keys are masked everywhere.
const PAD_ID: u32 = 0;

/// Validated rows laid out as tensors; position `(row, t)` is flat index `row·len + t`.
pub(crate) struct PaddedBatch {
    /// Every row is padded to this: the longest row, or more when asked (fixed length buckets).
    pub(crate) len: usize,
    /// Real length of each row.
    pub(crate) lengths: Vec<usize>,
    /// `[rows·len]` token ids.
    pub(crate) ids: Tensor,
    /// `[rows]` question types.
    pub(crate) qtypes: Tensor,
    /// Most markers in a row (upstream's `kmax`).
    pub(crate) kmax: usize,
    /// Number of markers of each row.
    pub(crate) marker_counts: Vec<usize>,
    /// `[rows·(1 + kmax)]` flat positions the head reads: per row its first token (the pooled
    /// `[CLS]`), then its markers; a missing marker points at the first token, as upstream's
    /// zero-padded `marker_pos` does.
    pub(crate) selected: Tensor,
}

impl PaddedBatch {
    /// Lays out `rows` (already validated: non-empty, markers inside their row) on `device`, padded
    /// to the longest row or to `pad_to` if that is longer. The rows may be borrowed (a group of a
    /// batch's rows): this is the one copy of their ids on the worker.
    pub(crate) fn new<R: Borrow<Row>>(rows: &[R], pad_to: usize, device: &Device) -> candle_core::Result<Self> {
        let rows: Vec<&Row> = rows.iter().map(Borrow::borrow).collect();
        let len = rows.iter().map(|r| r.ids.len()).max().unwrap_or(0).max(pad_to);
        let kmax = rows.iter().map(|r| r.markers.len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(rows.len() * len);
        let mut selected = Vec::with_capacity(rows.len() * (1 + kmax));
        for (i, row) in rows.iter().enumerate() {
            ids.extend_from_slice(&row.ids);
            ids.resize((i + 1) * len, PAD_ID);
            let start = (i * len) as u32;
            selected.push(start);
            selected.extend(row.markers.iter().map(|m| start + m));
            selected.resize((i + 1) * (1 + kmax), start);
        }
        let qtypes: Vec<u32> = rows.iter().map(|r| r.qtype.index()).collect();
        Ok(Self {
            len,
            lengths: rows.iter().map(|r| r.ids.len()).collect(),
            ids: Tensor::from_vec(ids, rows.len() * len, device)?,
            qtypes: Tensor::from_vec(qtypes, rows.len(), device)?,
            kmax,
            marker_counts: rows.iter().map(|r| r.markers.len()).collect(),
            selected: Tensor::from_vec(selected, rows.len() * (1 + kmax), device)?,
        })
    }

    /// Number of rows.
    pub(crate) fn rows(&self) -> usize {
        self.lengths.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use laya::question::QuestionType;

    #[test]
    fn pads_ids_and_points_missing_markers_at_the_first_token() -> candle_core::Result<()> {
        let rows = [
            Row {
                ids: vec![5, 6, 7],
                markers: vec![1, 2],
                qtype: QuestionType::Choice,
            },
            Row {
                ids: vec![8],
                markers: vec![0],
                qtype: QuestionType::Noul,
            },
        ];
        let batch = PaddedBatch::new(&rows, 0, &Device::Cpu)?;
        assert_eq!((batch.rows(), batch.len, batch.kmax), (2, 3, 2));
        assert_eq!(batch.ids.to_vec1::<u32>()?, [5, 6, 7, 8, 0, 0]);
        assert_eq!(batch.selected.to_vec1::<u32>()?, [0, 1, 2, 3, 3, 3]);
        assert_eq!(batch.qtypes.to_vec1::<u32>()?, [0, 2]);
        assert_eq!((batch.lengths, batch.marker_counts), (vec![3, 1], vec![2, 1]));
        Ok(())
    }
}
