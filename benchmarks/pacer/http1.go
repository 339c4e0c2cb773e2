package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"
)

// A conn is one keep-alive HTTP/1.1 connection that sends prebuilt requests and reads only the
// status and the length of each answer. net/http's client costs ~0.3 ms of CPU per paced request
// here (its read and write goroutines, per-request headers and buffers), as much as the Python
// client it replaces; this costs a few tens of microseconds.
type conn struct {
	addr     string
	timeout  time.Duration
	c        net.Conn
	in       []byte        // what has arrived of the answer
	connects *atomic.Int64 // the pass's count of connections opened
}

// wire builds the bytes of each request once, before any pass is timed.
func wire(target string, requests []Request) ([][]byte, string, error) {
	u, err := url.Parse(target)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, "", fmt.Errorf("url %q: need http://host:port/path", target)
	}
	out := make([][]byte, len(requests))
	for i, r := range requests {
		var b bytes.Buffer
		fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: %s\r\n", u.RequestURI(), u.Host)
		for name, value := range r.Headers {
			fmt.Fprintf(&b, "%s: %s\r\n", name, value)
		}
		fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n%s", len(r.Body), r.Body)
		out[i] = b.Bytes()
	}
	return out, u.Host, nil
}

// do sends one request and reads its answer; the status, or why there was none.
func (c *conn) do(request []byte) (int, error) {
	if c.c == nil {
		d, err := net.DialTimeout("tcp", c.addr, 5*time.Second)
		if err != nil {
			return 0, err
		}
		c.c = d
		c.connects.Add(1)
	}
	if err := c.c.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, c.drop(err)
	}
	if _, err := c.c.Write(request); err != nil {
		return 0, c.drop(err)
	}
	c.in = c.in[:0]
	for {
		if len(c.in) == cap(c.in) {
			c.in = append(c.in, 0)[:len(c.in)]
		}
		n, err := c.c.Read(c.in[len(c.in):cap(c.in)])
		c.in = c.in[:len(c.in)+n]
		if n == 0 && err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, c.drop(err)
		}
		status, length, keep, perr := parseAnswer(c.in)
		switch {
		case perr != nil:
			return 0, c.drop(perr)
		case length < 0 || len(c.in) < length:
			continue
		case len(c.in) > length:
			return 0, c.drop(errMalformed)
		}
		if !keep {
			_ = c.drop(nil)
		}
		return status, nil
	}
}

func (c *conn) drop(err error) error {
	if c.c != nil {
		_ = c.c.Close()
	}
	c.c = nil
	return err
}

var errMalformed = errors.New("malformed answer")

// parseAnswer reads the HTTP/1.1 answer at the start of b: its status, its whole length in bytes
// (head and body; -1 while b does not hold all of its head, or of a chunked body) and whether the
// connection stays open. An answer without a length (its body runs to the connection's end) is
// refused: the API always sends one.
func parseAnswer(b []byte) (status, length int, keep bool, err error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		return 0, -1, false, nil
	}
	lines := bytes.Split(b[:end], []byte("\r\n"))
	first := lines[0]
	if len(first) < 12 || !bytes.HasPrefix(first, []byte("HTTP/1.")) {
		return 0, 0, false, errMalformed
	}
	if status, err = strconv.Atoi(string(first[9:12])); err != nil {
		return 0, 0, false, errMalformed
	}
	body, chunked, keep := -1, false, first[7] == '1'
	for _, header := range lines[1:] {
		name, value, found := bytes.Cut(header, []byte(":"))
		if !found {
			return 0, 0, false, errMalformed
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if body, err = strconv.Atoi(string(value)); err != nil || body < 0 {
				return 0, 0, false, errMalformed
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			keep = !bytes.EqualFold(value, []byte("close"))
		}
	}
	head := end + 4
	switch {
	case chunked:
		size, err := chunkedLength(b[head:])
		if err != nil || size < 0 {
			return 0, -1, false, err
		}
		return status, head + size, keep, nil
	case body >= 0:
		return status, head + body, keep, nil
	}
	return 0, 0, false, errMalformed
}

// chunkedLength is the length of the chunked body at the start of b, trailers included; -1
// while b does not hold all of it.
func chunkedLength(b []byte) (int, error) {
	at := 0
	for {
		eol := bytes.Index(b[at:], []byte("\r\n"))
		if eol < 0 {
			return -1, nil
		}
		size, _, _ := bytes.Cut(b[at:at+eol], []byte(";"))
		n, err := strconv.ParseInt(string(bytes.TrimSpace(size)), 16, 32)
		if err != nil || n < 0 {
			return 0, errMalformed
		}
		at += eol + 2
		if n == 0 { // the last chunk, then trailers up to a blank line
			for {
				eol = bytes.Index(b[at:], []byte("\r\n"))
				if eol < 0 {
					return -1, nil
				}
				at += eol + 2
				if eol == 0 {
					return at, nil
				}
			}
		}
		at += int(n) + 2
		if at > len(b) {
			return -1, nil
		}
	}
}
