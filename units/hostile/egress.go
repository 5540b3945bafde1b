package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The egress attacks run in a sandbox granted network egress
// (test/e2e/egress_test.go).
func init() {
	// "egress-dial" dials each HOSTILE_ADDRS (comma-separated host:port)
	// over TCP and asks for "/" over HTTP, saying "ADDR ok FIRST-LINE" or
	// "ADDR refused ERR"; then "done".
	attacks["egress-dial"] = func() {
		for _, a := range strings.Split(os.Getenv("HOSTILE_ADDRS"), ",") {
			say("%s %s", a, fetch(a))
		}
		say("done")
	}
	// "egress-stream" reads lines from HOSTILE_ADDR on one connection,
	// saying "got LINE" for each, and "ended ERR" when it ends; then,
	// with HOSTILE_THEN set, it dials that address as egress-dial does
	// and says "then ok FIRST-LINE" or "then refused ERR".
	attacks["egress-stream"] = func() {
		defer func() {
			if a := os.Getenv("HOSTILE_THEN"); a != "" {
				say("then %s", fetch(a))
			}
		}()
		c, err := net.DialTimeout("tcp", os.Getenv("HOSTILE_ADDR"), 5*time.Second)
		if err != nil {
			say("ended %v", err)
			return
		}
		br := bufio.NewReader(c)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				say("ended %v", err)
				return
			}
			say("got %s", strings.TrimSpace(l))
		}
	}
	// "egress-drain" reads HOSTILE_ADDR's TCP stream to its end, closes
	// the connection, and says "drained BYTES ERR" (the egress benchmark:
	// the world times the transfer up to the close).
	attacks["egress-drain"] = func() {
		c, err := net.DialTimeout("tcp", os.Getenv("HOSTILE_ADDR"), 5*time.Second)
		if err != nil {
			say("drained 0 %v", err)
			return
		}
		n, err := io.Copy(io.Discard, c)
		c.Close()
		say("drained %d %v", n, err)
	}
	// "egress-listen" listens on TCP port 7000 and UDP port 7001 of every
	// address (another sandbox's, the host's, the world's target), says
	// "udp PAYLOAD" for each datagram (its own "self" on loopback first),
	// and "listening" once it answers itself on loopback.
	attacks["egress-listen"] = func() {
		l, err := net.Listen("tcp4", "0.0.0.0:7000")
		if err != nil {
			say("listen: %v", err)
			return
		}
		pc, err := net.ListenPacket("udp4", "0.0.0.0:7001")
		if err != nil {
			say("listen: %v", err)
			return
		}
		go func() {
			b := make([]byte, 1500)
			for {
				n, _, err := pc.ReadFrom(b)
				if err != nil {
					return
				}
				say("udp %s", b[:n])
			}
		}()
		if c, err := net.Dial("udp4", "127.0.0.1:7001"); err == nil {
			c.Write([]byte("self"))
			c.Close()
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				fmt.Fprintf(c, "HTTP/1.0 200 OK\r\n\r\nanother sandbox\n")
				c.Close()
			}
		}()
		say("listening %s", fetch("127.0.0.1:7000"))
	}
	// "egress-flood" sends HOSTILE_COUNT UDP datagrams "flood N" to
	// HOSTILE_ADDR, each from a port of its own (20000 + N): each a new
	// flow the host tracks, ten a millisecond. It says "sent N ERRORS".
	attacks["egress-flood"] = func() {
		dst, err := net.ResolveUDPAddr("udp4", os.Getenv("HOSTILE_ADDR"))
		if err != nil {
			say("address: %v", err)
			return
		}
		n, _ := strconv.Atoi(os.Getenv("HOSTILE_COUNT"))
		errs := 0
		for i := range n {
			c, err := net.DialUDP("udp4", &net.UDPAddr{Port: 20000 + i}, dst)
			if err == nil {
				_, err = c.Write([]byte("flood " + strconv.Itoa(i)))
				c.Close()
			}
			if err != nil {
				errs++
			}
			if i%10 == 9 {
				time.Sleep(time.Millisecond) // the world's socket keeps up
			}
		}
		say("sent %d %d", n, errs)
	}
	// "egress-spoof" sends a UDP datagram to HOSTILE_ADDR from a raw
	// socket, its source forged to HOSTILE_SOURCE, and one over a plain
	// UDP socket; it says what each send returned.
	attacks["egress-spoof"] = func() {
		dst, err := net.ResolveUDPAddr("udp4", os.Getenv("HOSTILE_ADDR"))
		if err != nil {
			say("address: %v", err)
			return
		}
		src := net.ParseIP(os.Getenv("HOSTILE_SOURCE")).To4()
		say("raw %v", sendRaw(src, dst, []byte("spoofed")))
		c, err := net.DialUDP("udp4", nil, dst)
		if err == nil {
			_, err = c.Write([]byte("plain"))
			c.Close()
		}
		say("plain %v", err)
	}
}

// fetch dials addr and reads the first line of its answer to a GET.
func fetch(addr string) string {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return "refused " + err.Error()
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", addr)
	l, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "refused read: " + err.Error()
	}
	return "ok " + strings.TrimSpace(l)
}

// sendRaw sends payload to dst as a UDP datagram in an IPv4 packet of
// its own making, with source src (IP_HDRINCL).
func sendRaw(src net.IP, dst *net.UDPAddr, payload []byte) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	d := dst.IP.To4()
	udp := make([]byte, 8+len(payload))
	udp[0], udp[1] = 0x30, 0x39 // source port 12345
	udp[2], udp[3] = byte(dst.Port>>8), byte(dst.Port)
	udp[4], udp[5] = byte(len(udp)>>8), byte(len(udp))
	copy(udp[8:], payload) // checksum 0: none, as UDP over IPv4 allows
	ip := make([]byte, 20, 20+len(udp))
	ip[0], ip[8], ip[9] = 0x45, 64, syscall.IPPROTO_UDP
	ip[2], ip[3] = byte((20+len(udp))>>8), byte(20+len(udp))
	copy(ip[12:16], src)
	copy(ip[16:20], d)
	ip = append(ip, udp...)
	var sa syscall.SockaddrInet4
	copy(sa.Addr[:], d)
	return syscall.Sendto(fd, ip, 0, &sa)
}
