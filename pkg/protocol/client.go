package protocol

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
	"unicode/utf8"
)

// Client is a unit's connection to the daemon. Its methods may be called
// from several goroutines; requests go one at a time. After an I/O error,
// a cancelled ctx, or an await that parks, the connection is unusable and
// every method returns that error.
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
	err  error // sticky
}

// Dial connects to the socket at path, normally
// [Dir]/[SocketFile].
func Dial(path string) (*Client, error) {
	conn, err := net.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("protocol: dial %s: %w", path, err)
	}
	return NewClient(conn), nil
}

// NewClient speaks the protocol over conn.
func NewClient(conn net.Conn) *Client {
	return &Client{conn: conn, r: bufio.NewReader(conn)}
}

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = errors.New("protocol: client closed")
	}
	return c.conn.Close()
}

// Hello asks which run and interval the unit is in, offering [Version].
func (c *Client) Hello(ctx context.Context) (Hello, error) {
	resp, err := c.do(ctx, Request{Op: OpHello, Protocol: Version})
	if err != nil {
		return Hello{}, err
	}
	h := Hello{Protocol: resp.Protocol, Run: resp.Run}
	if resp.Interval != nil {
		h.Interval = *resp.Interval
	}
	return h, nil
}

// Append asks the daemon to append data to the transcript and returns the
// transcript's new size. Data that is not UTF-8 is sent as base64.
func (c *Client) Append(ctx context.Context, data []byte) (int64, error) {
	req := Request{Op: OpAppend, Data: string(data)}
	if !utf8.Valid(data) {
		req.Data, req.Encoding = base64.StdEncoding.EncodeToString(data), EncodingBase64
	}
	resp, err := c.do(ctx, req)
	if err != nil {
		return 0, err
	}
	if resp.Size == nil {
		return 0, fmt.Errorf("protocol: append: response has no size")
	}
	return *resp.Size, nil
}

// Dispatch makes an outward call. A nil payload is sent as null.
func (c *Client) Dispatch(ctx context.Context, call Call) error {
	_, err := c.do(ctx, Request{Op: OpDispatch, ID: call.ID, Kind: call.Kind, Payload: call.Payload})
	return err
}

// Await asks for the results of ids. When parking is true the interval has
// ended: the daemon is destroying the sandbox, the connection is closed,
// and the unit must do nothing more — block until it is killed. The unit
// starts again in a fresh sandbox when the results are posted. When
// parking is false every result is already delivered; read them with
// [Client.Results].
func (c *Client) Await(ctx context.Context, ids ...string) (parking bool, err error) {
	resp, err := c.do(ctx, Request{Op: OpAwait, IDs: ids})
	if err != nil {
		return false, err
	}
	if resp.Parking == nil {
		return false, fmt.Errorf("protocol: await: response has no parking")
	}
	if *resp.Parking {
		c.mu.Lock()
		c.err = fmt.Errorf("protocol: %w", ErrParked)
		c.conn.Close()
		c.mu.Unlock()
	}
	return *resp.Parking, nil
}

// Results returns the results delivered to this interval.
func (c *Client) Results(ctx context.Context) ([]Result, error) {
	resp, err := c.do(ctx, Request{Op: OpResults})
	if err != nil {
		return nil, err
	}
	if resp.Results == nil {
		return nil, fmt.Errorf("protocol: results: response has no results")
	}
	return resp.Results, nil
}

// Result polls for one call's result inside the interval; ok is false
// while the platform has not posted it. A unit that waits this way keeps
// its sandbox, and its wait is inside the interval's receipt: the record
// proves it Blocked.
func (c *Client) Result(ctx context.Context, id string) (r Result, ok bool, err error) {
	resp, err := c.do(ctx, Request{Op: OpResult, ID: id})
	if err != nil {
		return Result{}, false, err
	}
	if resp.Ready == nil || (*resp.Ready && resp.Result == nil) {
		return Result{}, false, fmt.Errorf("protocol: result: malformed response")
	}
	if !*resp.Ready {
		return Result{}, false, nil
	}
	return *resp.Result, true, nil
}

// do sends req and reads its response, honouring ctx's deadline and
// cancellation.
func (c *Client) do(ctx context.Context, req Request) (Response, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return Response{}, c.err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return Response{}, fmt.Errorf("protocol: %s: %w", req.Op, err)
	}
	b = append(b, '\n')

	// ctx's end, deadline or cancellation, sets a deadline in the past,
	// which unblocks the write or read; the connection is then out of step
	// and unusable.
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	line, err := c.exchange(b)
	if !stop() && err == nil {
		err = ctx.Err() // ctx ended as the response arrived
	}
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		c.err = fmt.Errorf("protocol: %s: %w", req.Op, err)
		c.conn.Close()
		return Response{}, c.err
	}
	var resp Response
	if err := json.Unmarshal(line, &resp); err != nil {
		c.err = fmt.Errorf("protocol: %s: response: %w", req.Op, err)
		c.conn.Close()
		return Response{}, c.err
	}
	if !resp.OK {
		return resp, &Error{Code: resp.Code, Message: resp.Error}
	}
	return resp, nil
}

func (c *Client) exchange(b []byte) ([]byte, error) {
	if _, err := c.conn.Write(b); err != nil {
		return nil, err
	}
	return c.r.ReadBytes('\n')
}
