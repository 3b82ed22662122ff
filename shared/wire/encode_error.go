package wire

import (
	"strconv"
)

// AppendErrorEnvelope appends {"error": b} as json.Marshal writes an
// ErrorEnvelope (details as {} when there are none), without reflection:
// the filter writes one per refusal, the request a flood of refused clients
// makes. Details values of the types errors carry (string, int64, int,
// bool, []string, nil) are written as encoding/json writes them; any other
// is written as null. Its fuzz test holds it to json.Marshal.
func AppendErrorEnvelope(dst []byte, b *ErrorBody) []byte {
	dst = append(dst, `{"error":{"code":`...)
	dst = appendString(dst, b.Code)
	dst = append(dst, `,"message":`...)
	dst = appendString(dst, b.Message)
	dst = append(dst, `,"details":{`...)
	keys := make([]string, 0, len(b.Details))
	for k := range b.Details {
		keys = append(keys, k)
	}
	sortKeys(keys)
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(appendString(dst, k), ':')
		dst = appendAny(dst, b.Details[k])
	}
	dst = append(dst, '}')
	dst = appendOptString(dst, `,"request_id":`, b.RequestID)
	return append(dst, "}}"...)
}

func appendAny(dst []byte, v any) []byte {
	switch x := v.(type) {
	case string:
		return appendString(dst, x)
	case int64:
		return strconv.AppendInt(dst, x, 10)
	case int:
		return strconv.AppendInt(dst, int64(x), 10)
	case bool:
		return strconv.AppendBool(dst, x)
	case []string:
		if x == nil {
			return append(dst, "null"...)
		}
		dst = append(dst, '[')
		for i, s := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, s)
		}
		return append(dst, ']')
	}
	return append(dst, "null"...)
}
