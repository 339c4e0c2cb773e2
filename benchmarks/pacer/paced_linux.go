package main

import (
	"errors"
	"io"
	"net"
	"runtime"
	"syscall"
	"time"
	"unsafe"
)

// The paced pass as one event loop on one locked thread: epoll for the connections and a timerfd
// for the next due time. Sleeping goroutines cost the Go runtime ~0.2-0.3 ms of CPU per paced
// request here (a timer wake, netpoll and spinning threads for each one, with the process idle
// between), as much as the Python client; this loop sleeps in one epoll_wait between events.

type pacedLane struct {
	fd     int // -1: not connected (connected again when next handed a request)
	k      int
	due    time.Time
	out    []byte // the request's bytes not yet written
	in     []byte // what has arrived of the answer
	inUse  bool
	writes bool // EPOLLOUT asked for
}

type loop struct {
	s     *sender
	ep    int
	timer int
	addr  syscall.SockaddrInet4
	lanes []*pacedLane
	idle  []int // lanes free to send, the most recently freed last
	buf   []byte
}

const timerTag = -1 // the timerfd's epoll tag; a lane's is its index

func (s *sender) pacedLoop() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l, err := newLoop(s)
	if err != nil {
		return err
	}
	defer l.close()
	total := int(s.plan.Rate * s.plan.Seconds)
	deadline := s.start.Add(time.Duration((s.plan.Seconds + s.plan.GraceS) * float64(time.Second)))
	events := make([]syscall.EpollEvent, 128)
	next, inFlight := 0, 0
	for {
		now := time.Now()
		for next < total && !s.due(next).After(now) {
			switch l.dispatch(next) {
			case inFlightNow:
				inFlight++
			case shed:
				s.fail("shed")
			}
			next++
		}
		if next == total && inFlight == 0 {
			return nil
		}
		if !now.Before(deadline) {
			s.mu.Lock()
			s.result.Causes["unanswered"] += inFlight
			s.mu.Unlock()
			return nil
		}
		wake := deadline
		if next < total {
			wake = s.due(next)
		}
		if err := l.arm(wake.Sub(now)); err != nil {
			return err
		}
		n, err := l.wait(events)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return err
		}
		for _, ev := range events[:n] {
			if ev.Fd == timerTag {
				_, _ = syscall.Read(l.timer, l.buf[:8])
				continue
			}
			inFlight -= l.ready(int(ev.Fd), ev.Events)
		}
	}
}

// wait is epoll_wait without telling the Go runtime it blocks (RawSyscall6): told, it hands the
// thread's processor to another thread after 20 us and takes it back when the wait ends, ~9
// futex wakes and context switches per request, which cost more CPU than the requests. Untold,
// the runtime's monitor may interrupt a long wait with a signal to preempt it: EINTR, waited again.
func (l *loop) wait(events []syscall.EpollEvent) (int, error) {
	n, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_WAIT, uintptr(l.ep),
		uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), ^uintptr(0) /* -1: until an event */, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

func (s *sender) due(k int) time.Time {
	return s.start.Add(time.Duration(float64(k) / s.plan.Rate * float64(time.Second)))
}

func newLoop(s *sender) (*loop, error) {
	tcp, err := net.ResolveTCPAddr("tcp4", s.addr)
	if err != nil {
		return nil, err
	}
	l := &loop{s: s, lanes: make([]*pacedLane, s.plan.MaxInFlight), buf: make([]byte, 64<<10)}
	copy(l.addr.Addr[:], tcp.IP.To4())
	l.addr.Port = tcp.Port
	if l.ep, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return nil, err
	}
	l.timer = -1
	fd, _, errno := syscall.RawSyscall(syscall.SYS_TIMERFD_CREATE, 1 /* CLOCK_MONOTONIC */, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		l.close()
		return nil, errno
	}
	l.timer = int(fd)
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, l.timer, &syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: timerTag}); err != nil {
		l.close()
		return nil, err
	}
	for i := range l.lanes {
		l.lanes[i] = &pacedLane{fd: -1}
		l.idle = append(l.idle, len(l.lanes)-1-i) // lane 0 on top: the first sends reuse few connections
	}
	return l, nil
}

// arm sets the timer to fire after d (at once when d <= 0).
func (l *loop) arm(d time.Duration) error {
	if d < time.Microsecond {
		d = time.Microsecond
	}
	spec := [4]int64{0, 0, int64(d / time.Second), int64(d % time.Second)} // interval 0, then the value
	_, _, errno := syscall.RawSyscall6(syscall.SYS_TIMERFD_SETTIME, uintptr(l.timer), 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

type dispatched int

const (
	inFlightNow dispatched = iota // sent, or partly: its answer is awaited
	failedNow                     // recorded as failed already (no connection, a failed write)
	shed                          // every lane busy: not sent
)

// dispatch hands request k to the most recently freed lane.
func (l *loop) dispatch(k int) dispatched {
	n := len(l.idle)
	if n == 0 {
		return shed
	}
	i := l.idle[n-1]
	l.idle = l.idle[:n-1]
	lane := l.lanes[i]
	lane.k, lane.due, lane.inUse, lane.in = k, l.s.due(k), true, lane.in[:0]
	lane.out = l.s.wire[k%len(l.s.wire)]
	if lane.fd < 0 {
		if err := l.connect(i); err != nil {
			l.finish(i, causeOf(err), false)
			return failedNow
		}
	}
	l.write(i)
	if !lane.inUse {
		return failedNow
	}
	return inFlightNow
}

func (l *loop) connect(i int) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err = syscall.Connect(fd, &l.addr); err == nil {
		err = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	}
	if err == nil {
		err = syscall.SetNonblock(fd, true)
	}
	if err == nil {
		err = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(i)})
	}
	if err != nil {
		_ = syscall.Close(fd)
		return err
	}
	l.lanes[i].fd = fd
	l.s.connects.Add(1)
	return nil
}

func (l *loop) write(i int) {
	lane := l.lanes[i]
	for len(lane.out) > 0 {
		n, err := syscall.Write(lane.fd, lane.out)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if errors.Is(err, syscall.EAGAIN) {
			l.watchWrites(i, true)
			return
		}
		if err != nil {
			l.finish(i, causeOf(err), false)
			return
		}
		lane.out = lane.out[n:]
	}
	l.watchWrites(i, false)
}

func (l *loop) watchWrites(i int, on bool) {
	lane := l.lanes[i]
	if lane.writes == on {
		return
	}
	events := uint32(syscall.EPOLLIN | syscall.EPOLLRDHUP)
	if on {
		events |= syscall.EPOLLOUT
	}
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_MOD, lane.fd, &syscall.EpollEvent{Events: events, Fd: int32(i)}); err != nil {
		l.finish(i, causeOf(err), false)
		return
	}
	lane.writes = on
}

// ready handles lane i's events; it returns 1 when that ended the lane's request, else 0.
func (l *loop) ready(i int, events uint32) int {
	lane := l.lanes[i]
	if lane.fd < 0 {
		return 0
	}
	if !lane.inUse { // an idle connection readable: the server closed it; connect again on next use
		l.closeLane(i)
		return 0
	}
	if events&syscall.EPOLLOUT != 0 {
		l.write(i)
		if !lane.inUse {
			return 1
		}
	}
	for {
		n, err := syscall.Read(lane.fd, l.buf)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if errors.Is(err, syscall.EAGAIN) {
			return 0
		}
		if err != nil || n == 0 {
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			l.finish(i, causeOf(err), false)
			return 1
		}
		lane.in = append(lane.in, l.buf[:n]...)
		status, length, keep, err := parseAnswer(lane.in)
		switch {
		case err != nil:
			l.finish(i, causeOf(err), false)
			return 1
		case length < 0 || len(lane.in) < length: // more to come
			continue
		case len(lane.in) > length: // bytes beyond the answer: nothing was asked for them
			l.finish(i, causeOf(errMalformed), false)
			return 1
		default:
			l.finish(i, causeOfStatus(status), keep)
		}
		return 1
	}
}

// finish records lane i's request and frees the lane (its connection kept only when “keep“).
func (l *loop) finish(i int, cause string, keep bool) {
	lane := l.lanes[i]
	l.s.record(lane.k, lane.due, cause)
	lane.inUse, lane.out, lane.in = false, nil, lane.in[:0]
	if !keep {
		l.closeLane(i)
	}
	l.idle = append(l.idle, i)
}

func (l *loop) closeLane(i int) {
	lane := l.lanes[i]
	if lane.fd >= 0 {
		_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, lane.fd, nil)
		_ = syscall.Close(lane.fd)
	}
	lane.fd, lane.writes = -1, false
}

func (l *loop) close() {
	for i := range l.lanes {
		if l.lanes[i] != nil {
			l.closeLane(i)
		}
	}
	if l.timer >= 0 {
		_ = syscall.Close(l.timer)
	}
	_ = syscall.Close(l.ep)
}
