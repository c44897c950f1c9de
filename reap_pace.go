package idem

import "time"

// pacer decides how big Reap's next batch is and how long it rests after each one, from the
// batches it has measured. It needs no tuning: the traffic that shares the database shows in the
// reaper's own batches, which slow down when the server's CPU, locks or disk are busy.
//
// Two loops, each on what the reaper can measure by itself:
//
//   - Size: each batch is sized to take about ReapBatchTime, moving halfway from the last size
//     to the one the last batch's time asks for, so that one slow batch (a checkpoint, a cold
//     page) does not swing it. Short batches keep the row locks and the WAL of each commit small.
//   - Rest: after a batch the reaper rests so that it works ReapBusy of the time when its
//     batches go at the best speed it has seen, per row, in this call (the database at its
//     quietest). A share of the time is already fair to the traffic: when the server is busy a
//     row costs more, and the reaper deletes fewer a second, as the clients do fewer
//     transactions. When the batches cost more per row than the best, averaged over the last
//     few so that one slow batch does not count, the traffic has surged, and the rest grows in
//     proportion, up to maxReapPressure times: the reaper yields more than its fair share while
//     the surge lasts, and takes its share back when it eases. The best speed drifts up a
//     little with every batch, so that a lasting change in the cost of a row (a table grown
//     cold) is learnt again rather than read as pressure for ever.
type pacer struct {
	busy      float64       // ReapBusy: the share of time worked at the best speed
	batchTime time.Duration // ReapBatchTime: what one batch should take
	batch     int           // rows in the next batch
	best      float64       // the lowest cost per row seen in this drain, in seconds; 0 before the first
	pressure  float64       // the cost per row over the best, averaged over the last batches
}

const (
	minReapBatch = 16
	maxReapBatch = 20000

	// maxReapPressure bounds how far the reaper backs off beyond its fair share: at the default
	// ReapBusy it still works 1/7 of the time however slow its batches get, so that a backlog
	// drains at a rate that follows the clients' own rather than stalling behind it.
	maxReapPressure = 2.0
	// reapPressureWeight is the weight of the last batch in the averaged pressure.
	reapPressureWeight = 0.3
	// reapBestDrift is how fast the best cost per row is forgotten: 0.2 % a batch, so that a
	// cost per row twice the best is the new best after about 350 batches (a minute or so at
	// the defaults), long after a checkpoint or a burst of traffic has passed.
	reapBestDrift = 1.002
)

// start begins a drain of another kind of row: its cost per row is its own.
func (p *pacer) start(batch int) {
	p.batch, p.best, p.pressure = batch, 0, 1
}

// done takes a full batch of n rows (limit asked for) that took took, sets the next batch's
// size, and returns how long to rest before it and the pressure it read (1 when the batches go
// at the best speed seen).
func (p *pacer) done(n, limit int, took time.Duration) (rest time.Duration, pressure float64) {
	if took <= 0 || n <= 0 {
		return 0, 1
	}
	want := float64(limit) * float64(p.batchTime) / float64(took)
	p.batch = min(max(int((float64(p.batch)+want)/2), minReapBatch), maxReapBatch)

	cost := took.Seconds() / float64(n)
	if p.best == 0 || cost < p.best {
		p.best = cost
	} else {
		p.best = min(p.best*reapBestDrift, cost)
	}
	// Kept within its bounds, so that the end of a surge shows within a few batches.
	p.pressure = min(max(p.pressure+reapPressureWeight*(cost/p.best-p.pressure), 1), maxReapPressure)
	return time.Duration(float64(took) * (1 - p.busy) / p.busy * p.pressure), p.pressure
}
