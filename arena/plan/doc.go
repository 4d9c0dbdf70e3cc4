// Package plan packs the blocks of a repeating step into one region: given
// each block's size and lifetime (the call indices of its Malloc and its
// Free), it returns an offset for each such that no two blocks live at the
// same time overlap in address, and a region size as small as it can find.
// This is the dynamic storage allocation problem (NP-hard; Garey and
// Johnson); the lower bound on any packing is PeakLive, the most bytes
// live at once.
//
// The allocator records a step, asks Pack for a plan once, and serves
// every later step from it; Verify checks a plan.
package plan
