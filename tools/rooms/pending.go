package main

// The breaches known when their rules were added (issue 34), each owned
// by work under way: the functions still to take an options struct.
func init() {
	for _, b := range []string{
		"no non-test function takes more than 5 parameters besides its receiver: internal/executor/create.go build (7)",
		"no non-test function takes more than 5 parameters besides its receiver: internal/executor/create.go newContainer (7)",
		"no non-test function takes more than 5 parameters besides its receiver: internal/executor/deadline.go underDeadlineIn (6)",
	} {
		Pending[b] = true
	}
}
