package answers

// Booking is whom a run is started for (a platform key's books), made
// before the run exists: whoever it names sees the run's every event,
// its run.started included (daemon.StartBooked).
type Booking interface {
	// Book books run durably; an error refuses the start.
	Book(run string) error
	// Unbook takes back a booking whose start was then refused.
	Unbook(run string) error
}

// Starting is what a start request brings beside its unit and grant set
// (daemon.StartBooked).
type Starting struct {
	// Booking, when set, books the run for whom it is started.
	Booking Booking
	// Secrets are the values of the secrets the run reads, by name; they
	// go to the sandbox only (docs/trust.md#secrets).
	Secrets map[string]string
}
