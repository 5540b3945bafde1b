package answers

// Each is one run's part in an operation on many runs (`park --all`, the
// stop's parks, the start's resumes): its answer when it was carried
// out, and why not otherwise. Err may be set with an answer: the run was
// parked, but a later step (its listing for the next start) failed.
type Each[T any] struct {
	Run    string
	Answer *T
	Err    error
}
