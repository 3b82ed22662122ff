package leanhttp

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// Response is one answer, rendered into a buffer the connection reuses and
// written with one write: status line, Date, the handler's fields,
// Content-Type and Content-Length, then the body.
type Response struct {
	fields []byte // "Name: value\r\n" lines
	buf    []byte // the whole answer, once Write ran
	out    []byte // buf's storage, kept between answers
	close  bool   // the client asked to close after this answer
}

func (w *Response) reset() {
	w.fields, w.buf = w.fields[:0], nil
}

// Header adds a header field. Names are the handler's constants; a value
// with a line break is dropped rather than split the answer.
func (w *Response) Header(name, value string) {
	for i := 0; i < len(value); i++ {
		if value[i] == '\r' || value[i] == '\n' {
			return
		}
	}
	w.fields = append(w.fields, name...)
	w.fields = append(w.fields, ": "...)
	w.fields = append(w.fields, value...)
	w.fields = append(w.fields, "\r\n"...)
}

// HeaderInt adds a header field with a decimal value.
func (w *Response) HeaderInt(name string, v int64) {
	w.fields = append(w.fields, name...)
	w.fields = append(w.fields, ": "...)
	w.fields = strconv.AppendInt(w.fields, v, 10)
	w.fields = append(w.fields, "\r\n"...)
}

// Write renders the answer with status, content type and body; the body
// is copied.
func (w *Response) Write(status int, contentType string, body []byte) {
	b := append(w.out[:0], "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(status)...)
	b = append(b, "\r\nDate: "...)
	b = append(b, httpDate()...)
	b = append(b, "\r\n"...)
	b = append(b, w.fields...)
	b = append(b, "Content-Type: "...)
	b = append(b, contentType...)
	b = append(b, "\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(body)), 10)
	if w.close {
		b = append(b, "\r\nConnection: close"...)
	}
	b = append(b, "\r\n\r\n"...)
	w.out = append(b, body...)
	w.buf = w.out
}

// httpDate is the Date field's value, formatted once a second.
func httpDate() string {
	now := time.Now()
	if d := date.Load(); d != nil && d.sec == now.Unix() {
		return d.text
	}
	d := &dateText{sec: now.Unix(), text: now.UTC().Format(http.TimeFormat)}
	date.Store(d)
	return d.text
}

type dateText struct {
	sec  int64
	text string
}

var date atomic.Pointer[dateText]
