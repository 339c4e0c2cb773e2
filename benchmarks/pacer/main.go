// Command pacer sends the recall benchmark's requests to the API from a compiled client, so that
// the load generator takes as little as possible of the two cores it shares with the service.
//
// The Python benchmark (benchmarks/pacer.py) writes a plan: the URL, every request's headers and
// body exactly as the SDK would send them, and the pass to run. This program runs the pass and
// writes one record per request sent; the Python side turns them into the same figures as its own
// clients (latency from the due time, error causes, the timeline).
//
//	sequential  one keep-alive connection, one request after the other, until max_s
//	paced       open loop: request k due at start + k/rate whatever the answers do, at most
//	            max_in_flight unanswered (a request due beyond that is shed), each on its own
//	            keep-alive connection; unanswered grace_s after the last due time: an error
//	ceiling     closed loop: `connections` clients, each sending its next request when the last
//	            one answered, for `seconds`
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Request is one recall as the SDK would send it.
type Request struct {
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

// Plan is what the Python side asks for: a pass over the requests of RequestsFile.
type Plan struct {
	URL          string    `json:"url"`
	Mode         string    `json:"mode"`
	RequestsFile string    `json:"requests_file"` // a JSON array of Request, in sending order
	Requests     []Request `json:"-"`
	Rate         float64   `json:"rate"`
	Seconds      float64   `json:"seconds"`
	GraceS       float64   `json:"grace_s"`
	MaxInFlight  int       `json:"max_in_flight"`
	Connections  int       `json:"connections"`
	MaxS         float64   `json:"max_s"`
	TimeoutS     float64   `json:"timeout_s"`
}

// Record is one request sent: its index in the plan, when it was due (or sent) and how long its
// answer took from then, both in ns from the pass's start; Cause is "" for a 200.
type Record struct {
	K         int    `json:"k"`
	AtNs      int64  `json:"at_ns"`
	LatencyNs int64  `json:"latency_ns"`
	Cause     string `json:"cause,omitempty"`
}

// Result is the pass's outcome.
type Result struct {
	StartUnixNs int64          `json:"start_unix_ns"`
	WallS       float64        `json:"wall_s"`
	Records     []Record       `json:"records"`
	Causes      map[string]int `json:"causes"`
	CPUS        float64        `json:"cpu_s"`
	// TCP connections the pass opened: one per lane or client, and one more each time the
	// server closed one (a connection cap, an answer saying connection: close)
	Connects int64 `json:"connects"`
}

type sender struct {
	plan     *Plan
	wire     [][]byte // each request's bytes
	addr     string
	timeout  time.Duration
	start    time.Time
	mu       sync.Mutex
	result   Result
	connects atomic.Int64
}

func newSender(plan *Plan) (*sender, error) {
	requests, addr, err := wire(plan.URL, plan.Requests)
	if err != nil {
		return nil, err
	}
	timeout := time.Duration(plan.TimeoutS * float64(time.Second))
	return &sender{plan: plan, wire: requests, addr: addr, timeout: timeout, result: Result{Causes: map[string]int{}}}, nil
}

func (s *sender) conn() *conn { return &conn{addr: s.addr, timeout: s.timeout, connects: &s.connects} }

// send makes request k over c and returns why it failed ("" for a 200).
func (s *sender) send(c *conn, k int) string {
	status, err := c.do(s.wire[k%len(s.wire)])
	if err != nil {
		return causeOf(err)
	}
	return causeOfStatus(status)
}

// causeOfStatus names an answer that is not a 200 as the Python clients do ("" for a 200).
func causeOfStatus(status int) string {
	if status == 200 {
		return ""
	}
	return fmt.Sprintf("HTTP %d", status)
}

// causeOf names a failure without an answer the way the Python clients' httpx errors read.
func causeOf(err error) string {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		return "ReadTimeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "ConnectError"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, errMalformed):
		return "RemoteProtocolError"
	}
	return "TransportError"
}

func (s *sender) record(k int, at time.Time, cause string) {
	latency := time.Since(at)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.result.Records = append(s.result.Records, Record{K: k, AtNs: at.Sub(s.start).Nanoseconds(), LatencyNs: latency.Nanoseconds(), Cause: cause})
	if cause != "" {
		s.result.Causes[cause]++
	}
}

func (s *sender) fail(cause string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.result.Causes[cause]++
}

func (s *sender) sequential() {
	var deadline time.Time
	if s.plan.MaxS > 0 {
		deadline = s.start.Add(time.Duration(s.plan.MaxS * float64(time.Second)))
	}
	c := s.conn()
	defer c.drop(nil)
	for k := range s.wire {
		if !deadline.IsZero() && time.Now().After(deadline) {
			return
		}
		at := time.Now()
		s.record(k, at, s.send(c, k))
	}
}

func (s *sender) ceiling() {
	stop := s.start.Add(time.Duration(s.plan.Seconds * float64(time.Second)))
	var wg sync.WaitGroup
	for c := 0; c < s.plan.Connections; c++ {
		wg.Add(1)
		go func(first int) {
			defer wg.Done()
			c := s.conn()
			defer c.drop(nil)
			for k := first; time.Now().Before(stop); k += s.plan.Connections {
				at := time.Now()
				s.record(k, at, s.send(c, k))
			}
		}(c)
	}
	wg.Wait()
}

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	return float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e9
}

func readPlan(path string) (*Plan, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	plan := &Plan{}
	if err := json.Unmarshal(data, plan); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if data, err = os.ReadFile(plan.RequestsFile); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &plan.Requests); err != nil {
		return nil, fmt.Errorf("%s: %w", plan.RequestsFile, err)
	}
	if len(plan.Requests) == 0 {
		return nil, errors.New("the plan has no requests")
	}
	if plan.TimeoutS <= 0 {
		plan.TimeoutS = 30
	}
	switch {
	case plan.Mode == "paced" && (plan.MaxInFlight < 1 || plan.Rate <= 0):
		return nil, errors.New("paced: max_in_flight and rate must be > 0")
	case plan.Mode == "ceiling" && plan.Connections < 1:
		return nil, errors.New("ceiling: connections must be > 0")
	case plan.Mode != "sequential" && plan.Mode != "paced" && plan.Mode != "ceiling":
		return nil, fmt.Errorf("mode %q: need sequential, paced or ceiling", plan.Mode)
	}
	return plan, nil
}

// run runs the plan's pass; every request it sent has its record when it returns (the paced
// loop counts what is still unanswered at its deadline and leaves it).
func run(plan *Plan) (*Result, error) {
	s, err := newSender(plan)
	if err != nil {
		return nil, err
	}
	cpuBefore := cpuSeconds()
	// the first due time a little ahead, as the Python open loop does, so the first sends are not late
	s.start = time.Now().Add(200 * time.Millisecond)
	s.result.StartUnixNs = s.start.UnixNano()
	time.Sleep(time.Until(s.start))
	switch plan.Mode {
	case "sequential":
		s.sequential()
	case "paced":
		err = s.pacedLoop()
	case "ceiling":
		s.ceiling()
	}
	if err != nil {
		return nil, err
	}
	s.result.WallS = time.Since(s.start).Seconds()
	s.result.CPUS = cpuSeconds() - cpuBefore
	s.result.Connects = s.connects.Load()
	return &s.result, nil
}

func main() {
	planPath := flag.String("plan", "", "the plan (JSON) to run")
	outPath := flag.String("out", "", "where to write the result (JSON)")
	flag.Parse()
	plan, err := readPlan(*planPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pacer:", err)
		os.Exit(2)
	}
	result, err := run(plan)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pacer:", err)
		os.Exit(2)
	}
	data, err := json.Marshal(result)
	if err == nil {
		err = os.WriteFile(*outPath, data, 0o600)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pacer:", err)
		os.Exit(1)
	}
}
