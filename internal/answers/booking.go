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
